"""How much do a group's samples differ? The raw material of group-relative RL, by sampling setting.

    python benchmarks/exploration.py --env frozenlake                       # the shipped warm start
    python benchmarks/exploration.py --env frozenlake --set rollout.action_temperature=2 \
        --set rollout.action_top_k=4                                        # hot moves only
    python benchmarks/exploration.py --env sokoban --workdir runs/sokoban_tiny   # a run's policy

Plays the config's training rollout (`--groups` groups of `rollout.group_size` samples, `--keys`
rollout keys) from the initial policy (`model.init`) or a workdir's latest checkpoint, and
reports what GRPO can learn from: success, the share of turns with a valid answer, and the share
of groups whose samples choose a different first move, different first-turn moves, and reach
different successes. A group whose members all take the same moves teaches only the env's
noise; a hotter sampling that breaks the answer's format teaches the format (docs/tuning.md,
"Levers on FrozenLake").
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from ragen_jax.analysis import run_configs
from ragen_jax.rollout.play import rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.run.checkpoint import CheckpointError
from ragen_jax.core.errors import ConfigError
from ragen_jax.run.experiment import load_initial_weights, make_experiment


def group_spread(success: np.ndarray, first_turn: np.ndarray, group_size: int) -> dict[str, float]:
    """success bool[B], first_turn int[B, A] (the first turn's parsed moves, 0 = none) -> the
    shares of groups whose members differ in their first move, their first turn's moves, and
    their success."""
    groups = success.shape[0] // group_size
    moves = first_turn.reshape(groups, group_size, -1)
    wins = success.reshape(groups, group_size)
    return {"first move differs": float(np.mean([len(set(g[:, 0])) > 1 for g in moves])),
            "first-turn moves differ": float(np.mean([len({tuple(m) for m in g}) > 1 for g in moves])),
            "success varies": float(np.mean(wins.min(1) != wins.max(1)))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=sorted(run_configs.CONFIGS), required=True)
    p.add_argument("--workdir", default="", help="a training run: its latest checkpoint's policy")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--keys", type=int, default=4, help="rollouts (keys 100, 101, ...) averaged over")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config override, e.g. rollout.action_temperature=2")
    args = p.parse_args(argv)
    for flag in ("groups", "keys"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag}={getattr(args, flag)} must be >= 1")
    overrides = run_configs.set_overrides(args.set, p.error)

    try:
        exp = make_experiment(run_configs.run_config(args.env, 0, {"rollout.num_groups": str(args.groups),
                                                                 "mesh.data": "1",
                                                                 **overrides}))
        if args.workdir:
            load_initial_weights(exp.model, args.workdir)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    rc = exp.run.step.rollout
    play = jax.jit(lambda k: rollout(k, model_policy(exp.model, exp.codec, exp.prompt, rc), exp.env,
                                     exp.env_params, exp.codec, exp.prompt, rc))
    rows = []
    for i in range(args.keys):
        traj = play(jax.random.key(100 + i))
        success = np.asarray(traj.success)
        active = np.asarray(traj.turn_active)
        rows.append({"success": float(success.mean()), "valid turns": float(np.asarray(traj.turn_valid)[active].mean()),
                     **group_spread(success, np.asarray(traj.turn_actions)[:, 0], rc.group_size)})
    print(f"{args.env}, {args.groups} groups x {rc.group_size}, {args.keys} rollouts; "
          f"T {rc.sampling.temperature}, moves: "
          + (f"T {rc.action_sampling.temperature}, top-k {rc.action_sampling.top_k}" if rc.action_sampling else "same"))
    for name in rows[0]:
        print(f"  {name}: {np.mean([r[name] for r in rows]):.3f}")


if __name__ == "__main__":
    main()
