"""`python -m ragen_jax.evaluate --workdir DIR [--step N] [--episodes K] [--samples K]`

Restores a training run's policy (parameters only) from its latest checkpoint or step N,
runs validation rollouts on fixed seeds at the configured temperature (0.5 by default,
docs/method.md#validation), and prints a table. Writes DIR/eval_<step>.json (success, return,
valid-action rate, pass@k and the MI diagnostics of the validation rollouts) and
DIR/eval_<step>_trajectories.txt (a few trajectories as readable text). A workdir it cannot write is refused before anything is
played; a damaged latest checkpoint is named and the newest one that restores is evaluated
(a damaged `--step N` is an error); the table is printed before the files are written.

Like `train`, it runs under several processes on one mesh (`--coordinator/--num-processes/
--process-id`, or auto-detected on TPU pods and SLURM): every process restores its shards and
plays its share of the levels; process 0 prints and writes. Any process count can evaluate a
checkpoint written by any other. On a CPU it first gives the host one jax device per core when
the run's mesh is the default, as `train` does (ragen_jax/core/host_devices.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

import jax
import ml_collections
from flax import nnx

from ragen_jax.diagnostics import reasoning_check
from ragen_jax.core import compile_cache, distributed, host_devices, quiet, sharding
from ragen_jax.run.checkpoint import CheckpointError
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import check_writable_dir, describe, write_atomically


def evaluate(workdir: Path, step: int | None, episodes: int | None, samples: int | None, show: int = 4) -> dict:
    """Play, score and write DIR/eval_<step>.json and its trajectories; returns the result."""
    result, text = play(workdir, step, episodes, samples, show)
    if distributed.is_lead():
        write_results(workdir, result, text)
    return result


def play(workdir: Path, step: int | None, episodes: int | None, samples: int | None,
         show: int = 4) -> tuple[dict, str]:
    """The evaluation's result and a few trajectories as text (on process 0; "" elsewhere).
    Refuses a workdir it could not write its results to before playing anything."""
    from ragen_jax.run.experiment import restore_run
    from ragen_jax.rollout.render import render_trajectories

    if workdir.is_dir() and distributed.is_lead():
        check_writable_dir(workdir, "--workdir")
    exp, step = restore_run(workdir, step)
    e = exp.run.settings.eval
    eval_config = dataclasses.replace(e, num_envs=episodes or e.num_envs, samples_per_env=samples or e.samples_per_env)
    metrics, traj = validate_with_diagnostics(exp, eval_config)
    k = eval_config.samples_per_env
    result = {"step": step, "episodes": eval_config.num_envs, "samples_per_env": k,
              "temperature": eval_config.temperature, "seed": eval_config.seed, "metrics": metrics}
    if not distributed.is_lead():
        return result, ""
    return result, render_trajectories(traj, exp.tokenizer, count=show, group_size=k)


def validate_with_diagnostics(exp, eval_config) -> tuple[dict, object]:
    """Validation of the experiment's current policy on `eval_config`'s levels, with the first
    turn's MI diagnostics (scored as the run scores them) and, for templated reasoning, the
    board-reading shares; returns the metrics (python floats) and the trajectories on the host."""
    from ragen_jax.diagnostics.diagnose import DiagnosticsState, evaluation_config
    from ragen_jax.models.stacking import for_inference
    from ragen_jax.training.validation import Validator

    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, eval_config,
                          exp.run.step.rollout, exp.mesh)
    metrics, traj = validator(nnx.state(exp.model))
    d = exp.run.settings.diagnostics
    mi_config = evaluation_config(eval_config.num_envs * eval_config.samples_per_env, d.score_rows, d.span_buckets)
    with sharding.tracing_on(exp.mesh):
        mi, _ = _diagnose_compiled()(
            for_inference(exp.model), traj, jax.random.key(eval_config.seed), mi_config, DiagnosticsState.create(),
            group_size=eval_config.samples_per_env, mesh=exp.mesh)
    metrics.update({k: float(v) for k, v in mi.items() if k.startswith("mi/first_turn/")
                    or k == "mi/reasoning_length_mean"})
    traj = distributed.to_host(traj)  # rows live on every process's devices (a collective)
    metrics.update(reasoning_check.validation_metrics(traj, exp.tokenizer, exp.env, exp.env_params))  # templates only
    return metrics, traj


@functools.cache
def _diagnose_compiled():
    """`diagnose` jitted once per process, so validations of other levels or weights (e.g.
    benchmarks/grounding_mi.py's batches) reuse its compilation."""
    from ragen_jax.diagnostics.diagnose import diagnose

    return jax.jit(diagnose, static_argnames=("config", "group_size", "mesh"))


def write_results(workdir: Path, result: dict, trajectories: str) -> None:
    step = result["step"]
    write_atomically(workdir / f"eval_{step}.json", json.dumps(result, indent=2))
    write_atomically(workdir / f"eval_{step}_trajectories.txt", trajectories)


def split_host(workdir: Path, episodes: int | None, samples: int | None) -> int | None:
    """Before jax starts: one jax device per CPU core, as `train` does (host_devices), as many as
    divide the validation's rows; read from the run's saved config, so its mesh decides. A
    missing or unreadable config sets nothing (evaluate then reports it)."""
    try:
        config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
        rows = (episodes or config.eval.num_envs) * (samples or config.eval.samples_per_env)
        return host_devices.split_host(config, (rows,))
    except (OSError, ValueError, AttributeError, KeyError):
        return None


def table(result: dict) -> str:
    m = result["metrics"]
    rows = [("success", m["success"]), (f"pass@{result['samples_per_env']}", m["pass@k"]),
            ("return", m["return"]), ("valid-action rate", m["valid_action_rate"]),
            ("MI estimate (first turn)", m.get("mi/first_turn/mi_estimate", float("nan"))),
            ("retrieval acc / chance", f"{m.get('mi/first_turn/retrieval_acc', float('nan')):.3f} / "
                                       f"{m.get('mi/first_turn/retrieval_chance', float('nan')):.3f}"),
            ("reasoning length (tokens)", m.get("mi/reasoning_length_mean", float("nan")))]
    if "reasoning/player_right" in m:  # the built-in tasks' reasoning template (ragen_jax.diagnostics.reasoning_check)
        rows += [("reasoning: player cell right", m["reasoning/player_right"]),
                 ("reasoning: most named player cell's share", m["reasoning/player_top_share"]),
                 ("answer repeats the reasoning", m["reasoning/answer_repeats_reasoning"])]
    for kind in ("holes", "walls"):  # the template may also name the holes (FrozenLake) or walls next to the player
        if f"reasoning/{kind}_right" in m:
            rows += [(f"reasoning: {kind} next to player right", m[f"reasoning/{kind}_right"])]
    width = max(len(name) for name, _ in rows)
    lines = [f"step {result['step']}: {result['episodes']} episodes × {result['samples_per_env']} samples, "
             f"temperature {result['temperature']}, seed {result['seed']}"]
    lines += [f"  {name:<{width}}  {value if isinstance(value, str) else f'{value:.3f}'}" for name, value in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    quiet.commands()
    parser = argparse.ArgumentParser(description="Evaluate a trained policy from its checkpoint.")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--episodes", type=int, default=None, help="levels to play (default: config eval.num_envs)")
    parser.add_argument("--samples", type=int, default=None, help="attempts per level, the k of pass@k")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("episodes", "samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"error: --{name}={getattr(args, name)} must be >= 1", file=sys.stderr)
            return 2
    if args.coordinator is None and (count := split_host(Path(args.workdir), args.episodes, args.samples)):
        print(host_devices.note(count), file=sys.stderr)
    try:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        compile_cache.enable()
        result, trajectories = play(Path(args.workdir), args.step, args.episodes, args.samples)
    except (ConfigError, CheckpointError, ValueError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    if not distributed.is_lead():
        return 0
    print(table(result), flush=True)  # before any write that could fail: the results are never lost
    try:
        write_results(Path(args.workdir), result, trajectories)
    except OSError as err:
        print(f"error: the results above were not saved: {describe(err)}", file=sys.stderr)
        return 1
    print(f"wrote {Path(args.workdir) / ('eval_%d.json' % result['step'])}")
    return 0


if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
