"""The learning runs and the reproduction study behind docs/results.md.

    # does the default CPU run learn? start vs end validation success, per seed
    python benchmarks/reproduce.py learn --env sokoban --seeds 0 1 2 --out results/learn

    # the study (the paper's claims at this scale), part by part or all of it, resumable:
    python benchmarks/reproduce.py study --part main --out results/study       # filters × algorithms, 5 seeds
    python benchmarks/reproduce.py study --part noise --out results/study      # FrozenLake's slip, Top-p vs none
    python benchmarks/reproduce.py study --part gradients --out results/study  # gradient norms by reward-std bucket
    python benchmarks/reproduce.py study --part reward_noise --out results/study  # random rewards, Top-p vs none
    python benchmarks/reproduce.py study --out results/study                   # all three, in that order
    # N runs at a time, each its own process (the cores shared out, or one GPU shared):
    python benchmarks/reproduce.py study --jobs 8 --out results/study
    # a subset in minutes: one env/algorithm, two arms, one seed, a few steps
    python benchmarks/reproduce.py study --part main --envs sokoban --algos grpo --filters top_p top_k \
        --seeds 0 --steps 4 --out results/smoke

    # the best success any policy could reach on the validation levels (turns, budget, slip)
    python benchmarks/reproduce.py ceiling --env frozenlake [--set rollout.max_turns=5 ...]

    # the claims with bootstrap intervals, the per-arm table, gradient buckets, one figure per env
    python benchmarks/reproduce.py report --out results/study --figures docs/figures

Every run is an ordinary `ragen_jax.train` run in `<out>/<env>/<arm>/seed<k>` (metrics.jsonl,
checkpoints every 10 steps), so a stopped study resumes where it stopped: finished runs are
skipped, interrupted ones resume from their last checkpoint. After every arm `<out>/report.md`
is rewritten from the finished runs. With `--jobs N` each run is this script for that run
alone, N at a time, its output in `<out>/logs/`.

What each part runs: ragen_jax/analysis/study_arms.py; running and resuming: study_runs.py and
study_jobs.py; the report: study_report.py; the statistics: study.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_jax.analysis import level_ceilings, study_arms, study_report, study_runs
from ragen_jax.analysis.run_configs import CONFIGS, set_overrides
from ragen_jax.core import compile_cache, quiet


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags `learn` and `study` share."""
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, help="0: the config's (study: gradients 50, recorded 40)")
    # learn and study: the config's validation (128 levels × 8 samples; one sample per level
    # has a standard error of ~0.04, docs/tuning.md), study every 50 / 20 steps
    p.add_argument("--val-every", type=int)
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--eval-samples", type=int,
                   help="samples per validation level (success is over all of them; pass@k too)")
    p.add_argument("--set", action="append", default=[],
                   metavar="KEY=VALUE", help="any other config override, e.g. rollout.num_groups=2")


def add_study_flags(p: argparse.ArgumentParser) -> None:
    """`study`'s selection of parts and arms (unset: `study_arms.Study`'s defaults)."""
    p.add_argument("--part", choices=["all", *study_arms.PARTS],
                   help="all: main, noise and gradients in turn; reward_noise: the random-reward axis; recorded: the "
                        "40-step study of docs/results.md as it ran")
    p.add_argument("--envs", nargs="+", choices=sorted(CONFIGS),
                   help="default: the part's (main: both; noise: frozenlake; gradients: sokoban)")
    p.add_argument("--seeds", type=int, nargs="+", help="default: main 0-4, noise 0-2, gradients 0, recorded 0-2")
    p.add_argument("--filters", nargs="+", choices=sorted(study_arms.FILTERS))
    p.add_argument("--algos", nargs="+", choices=study_arms.ALGOS)
    p.add_argument("--rates", nargs="+", help="noise: FrozenLake's env.success_rate values (decimals or fractions)")
    p.add_argument("--reward-noise", nargs="+", help="reward_noise: the env.reward_noise values, in [0, 1]")
    p.add_argument("--reg", nargs="+", metavar="ENTROPY:KL", help="gradients: entropy and KL coefficients of each arm")
    p.add_argument("--grad-buckets", type=int)
    p.add_argument("--diag-samples", type=int, help="MI diagnostics' samples (main, noise)")
    p.add_argument("--jobs", type=int, help="runs at a time, each its own process sharing the cores or one GPU (main, "
                                            "noise, gradients; default 1: one after another in this process)")


def parse_args(argv=None) -> tuple[str, object]:
    """The command and what it asks for: a `Learn` or a `Study` (a flag left out takes its
    default there), or the flags of `ceiling` and `report`. A bad value exits 2 with one line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # learn and study leave a flag that is not given unset, so that `Learn` / `Study` give its default
    learn = sub.add_parser("learn", argument_default=argparse.SUPPRESS)
    learn.add_argument("--env", choices=sorted(CONFIGS), required=True)
    learn.add_argument("--seeds", type=int, nargs="+")
    add_run_flags(learn)
    study = sub.add_parser("study", argument_default=argparse.SUPPRESS)
    add_study_flags(study)
    add_run_flags(study)
    ceiling = sub.add_parser("ceiling")
    ceiling.add_argument("--env", choices=sorted(CONFIGS), required=True)
    ceiling.add_argument("--eval-episodes", type=int, default=128)
    ceiling.add_argument("--set", action="append", default=[],
                         metavar="KEY=VALUE", help="any other config override, e.g. rollout.max_turns=5")
    report = sub.add_parser("report")
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--figures", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "report":
        return args.command, args
    if args.command == "ceiling":
        if args.eval_episodes < 1:
            parser.error(f"--eval-episodes={args.eval_episodes} must be >= 1")
        args.set = set_overrides(args.set, parser.error)
        return args.command, args
    fields = {key: value for key, value in vars(args).items() if key not in ("command", "set")}
    options = (study_arms.Learn if args.command == "learn" else study_arms.Study)(**fields)
    if problem := options.error():
        parser.error(problem)
    options.overrides = set_overrides(args.set, parser.error)
    return args.command, options


def main(argv=None) -> int:
    """Run the command; a failure ends it with one line and a non-zero exit."""
    command, options = parse_args(argv)
    if command in ("learn", "study"):
        compile_cache.enable()  # every seed and arm compiles the same programs (jax's backend not started yet)
    if command == "learn":
        study_runs.learn(options)
    elif command == "study":
        study_runs.run_study(options, Path(__file__).resolve())
    elif command == "ceiling":
        level_ceilings.print_ceilings(options.env, options.eval_episodes, options.set)
    else:
        study_report.report(options.out, options.figures)
    return 0


if __name__ == "__main__":
    sys.exit(quiet.run_program(main))  # its runs never import PyTorch
