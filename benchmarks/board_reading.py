"""Does the policy read the board? Checks its own reasoning against the board it was shown.

    python benchmarks/board_reading.py --env sokoban                 # the shipped warm start
    python benchmarks/board_reading.py --workdir runs/sokoban_tiny   # a run's latest checkpoint
    python benchmarks/board_reading.py --workdir runs/sokoban_tiny --step 50   # or one step's

Plays the validation levels (config `eval.*`, `--episodes` of them) and, for every turn the
warm-start reasoning template was followed ("Player (r, c), ... I move A then B."), checks
(1) the stated player coordinates against the state shown that turn (the game's grader), and
(2) that the answer repeats the moves the reasoning names (`ragen_jax.diagnostics.reasoning_check`; training
logs the same shares at every validation as `val/reasoning/*`). Success is bounded by both: a
policy that cannot locate itself cannot plan, whatever RL does with its rewards.

On Sokoban (deterministic moves) it also grades the first turn's plan on every level the BFS
solver can finish within the move budget: do the moves the reasoning names, and separately the
moves the answer gives, leave the level solvable in the moves that remain, and is the first of
them the solver's first move? The environment acts on the answer only, so this says whether
the reasoning's plan is better than the action actually taken.

On FrozenLake it also replays the levels on the same lake without slips (`success_rate` 1),
`--samples` attempts each: what is left of the failures is the policy's own walking into
holes or wasting moves, the part of the gap to the best possible policy that RL has to remove
by changing choices rather than by luck (docs/tuning.md, "FrozenLake: the second stage and where
it fails").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_jax.analysis import run_configs
from ragen_jax.diagnostics.reasoning_check import graded_turns, named_and_answered, reading_scores

def first_turn_plans(firsts, env, env_params, budget: int, turns: int, per_turn: int) -> dict[str, float]:
    """Grade each trajectory's first-turn moves against the BFS solver from its start state.

    `firsts`: (the state the first turn was shown, host arrays; the model's output) per
    trajectory. Levels the solver cannot finish within `budget` moves are skipped. "keeps" =
    after the moves, the level is solved or the solver finishes it in the moves left: the
    budget's rest, and at most `per_turn` in each of the `turns - 1` turns left."""
    import jax

    step = jax.jit(env.step, static_argnums=3)
    names = list(env.action_names)

    def keeps(state, moves: list[str]) -> bool:
        for name in moves:
            state, _, done, _ = step(jax.random.key(0), state, names.index(name) + 1, env_params)
            if bool(done):
                return bool(state.success)
        plan = env.solve(state, env_params)
        return plan is not None and len(plan) <= min(budget - len(moves), (turns - 1) * per_turn)

    counts = dict(levels=0, reasoning_keeps=0, answer_keeps=0, reasoning_first_optimal=0, answer_first_optimal=0)
    for start, output in firsts:
        moves = named_and_answered(output)
        if not moves or not all(m in names for m in moves[0] + moves[1]):
            continue
        plan = env.solve(start, env_params)
        if plan is None or not plan or len(plan) > min(budget, turns * per_turn):
            continue
        named, answered = moves
        best = names[plan[0] - 1]
        counts["levels"] += 1
        counts["reasoning_keeps"] += keeps(start, named[:per_turn])
        counts["answer_keeps"] += keeps(start, answered[:per_turn])
        counts["reasoning_first_optimal"] += named[0] == best
        counts["answer_first_optimal"] += answered[0] == best
    levels = max(counts["levels"], 1)
    return {k: (v / levels if k != "levels" else v) for k, v in counts.items()}


def lake_outcomes(success, turn_active, samples: int) -> dict[str, float]:
    """Tallies of `samples` attempts per level (rows level-major): success; failures that ended
    before the last turn (on a lake without slips: a hole the policy walked into); the levels
    never and always solved."""
    import numpy as np

    success, turn_active = np.asarray(success, bool), np.asarray(turn_active, bool)
    per_level = success.reshape(-1, samples).mean(axis=1)
    return dict(success=float(success.mean()),
                failed_before_last_turn=float((~success & ~turn_active[:, -1]).mean()),
                levels=len(per_level), never_solved=int((per_level == 0).sum()),
                always_solved=int((per_level == 1).sum()))


def no_slip_replay(exp, eval_config, samples: int) -> dict[str, float]:
    """`lake_outcomes` of the experiment's policy on its validation levels, `samples` attempts
    each, on the same lakes with slipping switched off (`success_rate` 1)."""
    import dataclasses

    import jax

    from ragen_jax.training.validation import validate

    still = dataclasses.replace(exp.env_params, success_rate=1.0)
    config = dataclasses.replace(eval_config, samples_per_env=samples)
    _, traj = validate(exp.model, exp.env, still, exp.codec, exp.prompt, config, exp.run.step.rollout, exp.mesh)
    host = jax.device_get(traj)
    return lake_outcomes(host.success, host.turn_active, samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--env", choices=("sokoban", "frozenlake"), help="the shipped warm start of configs/<env>_tiny.py")
    source.add_argument("--workdir", type=Path, help="a training run: its latest checkpoint")
    parser.add_argument("--step", type=int, default=None, help="with --workdir: this checkpoint step instead")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8, help="FrozenLake: attempts per level on the lake without slips")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.samples < 1:
        parser.error(f"--episodes={args.episodes} and --samples={args.samples} must be >= 1")
    if args.step is not None and not args.workdir:
        parser.error("--step needs --workdir (the shipped warm start has no steps)")

    from ragen_jax.run.checkpoint import CheckpointError
    from ragen_jax.core.errors import ConfigError
    from ragen_jax.run.experiment import make_experiment, restore_run
    from ragen_jax.core import distributed
    from ragen_jax.training.validation import EvalConfig, validate

    try:
        if args.workdir:
            exp, step = restore_run(args.workdir, args.step)
            what = f"{args.workdir} step {step}"
        else:
            exp = make_experiment(run_configs.run_config(args.env, 0, {}))
            what = f"builtin:{args.env}-tiny"
    except (ConfigError, CheckpointError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    e = exp.run.settings.eval
    eval_config = EvalConfig(num_envs=args.episodes, samples_per_env=1, temperature=e.temperature, seed=e.seed)
    metrics, traj = validate(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, eval_config,
                             exp.run.step.rollout, exp.mesh)
    turns = list(graded_turns(distributed.to_host(traj), exp.tokenizer, exp.env, exp.env_params))
    scores = reading_scores((grades, output) for *_, grades, output in turns)
    print(f"{what}: {args.episodes} validation levels at temperature {e.temperature}, {scores['turns']} turns")
    print(f"  success                               {metrics['success']:.3f}")
    print(f"  turns stating the player's cell       {scores.get('player_stated', 0.0):.3f}")
    print(f"  ... with the right cell               {scores.get('player_right', 0.0):.3f}")
    print(f"  ... naming the most named cell        {scores.get('player_top_share', 0.0):.3f}")
    print(f"  answers repeating the reasoning's moves {scores['answer_repeats_reasoning']:.3f}")
    kind = exp.env.blocked_kind  # the template may name the moves into holes (FrozenLake) or walls (Sokoban)
    if f"{kind}_right" in scores:
        print(f"  turns naming the {kind} next to the player {scores[f'{kind}_stated']:.3f}")
        print(f"  ... naming exactly the board's        {scores[f'{kind}_right']:.3f}")
    if hasattr(exp.env, "state_from_rooms"):  # Sokoban: moves are deterministic, plans can be graded
        rollout_config = eval_config.rollout_config(exp.run.step.rollout)
        firsts = [(state, output) for _, turn, state, _, output in turns if turn == 0]
        plans = first_turn_plans(firsts, exp.env, exp.env_params, rollout_config.max_actions_per_traj,
                                 rollout_config.max_turns, rollout_config.max_actions_per_turn)
        print(f"  first turns on the {plans['levels']} levels solvable in {rollout_config.max_actions_per_traj} moves:")
        print(f"    level still solvable after the reasoning's moves {plans['reasoning_keeps']:.3f}, "
              f"after the answer's {plans['answer_keeps']:.3f}")
        print(f"    first move = the solver's: reasoning {plans['reasoning_first_optimal']:.3f}, "
              f"answer {plans['answer_first_optimal']:.3f}")
    if hasattr(exp.env_params, "success_rate"):  # FrozenLake: the same levels without slips
        lake = no_slip_replay(exp, eval_config, args.samples)
        print(f"  the same levels without slips, {args.samples} attempts each: success {lake['success']:.3f}, "
              f"failed before the last turn (a hole) {lake['failed_before_last_turn']:.3f}; "
              f"levels never solved {lake['never_solved']}, always solved {lake['always_solved']} "
              f"of {lake['levels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
