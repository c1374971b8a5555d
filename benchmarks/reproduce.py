"""The learning runs and the small-scale reproduction study behind docs/results.md.

    # does the default CPU run learn? start vs end validation success, per seed
    python benchmarks/reproduce.py learn --env sokoban --seeds 0 1 2 --out results/learn  # the config's validation

    # the paper's findings: Top-p 0.9 vs Top-k vs no filter, PPO and GRPO, per seed
    python benchmarks/reproduce.py study --env frozenlake --seeds 0 1 2 --steps 40 --out results/study  # ~1 h per seed

    # the best success any policy could reach on the validation levels (turns, budget, slip)
    python benchmarks/reproduce.py ceiling --env frozenlake [--set rollout.max_turns=5 ...]

    # tables (markdown), correlations, gradient buckets and one figure per env
    python benchmarks/reproduce.py report --out results/study --figures docs/figures

Every run is an ordinary `ragen_jax.train` run of `configs/<env>_tiny.py` in
`<out>/<env>/<arm>/seed<k>` (metrics.jsonl, checkpoints), so a crashed study resumes where it
stopped: finished runs are skipped, interrupted ones resume from their last checkpoint.
The statistics themselves live in `ragen_jax.study` (tested against independent references).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ragen_jax import compile_cache, host_devices
from ragen_jax import study as st  # numpy only; the jax-heavy imports stay inside the commands

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"sokoban": ROOT / "configs" / "sokoban_tiny.py", "frozenlake": ROOT / "configs" / "frozenlake_tiny.py"}
# The study's arms: the filter (SPEC §4: Top-p on reward variance, Top-k keeping the same
# fraction of groups on average as the paper's comparison, or none) × the algorithm.
FILTERS = {
    "top_p": {"filter.strategy": "top_p", "filter.rho": "0.9"},
    "top_k": {"filter.strategy": "top_k", "filter.rho": "0.25"},
    "none": {"filter.strategy": "none"},
}
ALGOS = ("ppo", "grpo")
# The study's base: the tiny defaults when it ran (docs/results.md §10), so that its command
# still reproduces it after the defaults moved to 32 × 4 without the entropy bonus (§12) and
# FrozenLake's to Adam ε 1e-3 (§19) and Sokoban's to a decaying learning rate (§26); Top-k's
# rho was matched to Top-p's kept fraction with these groups. `--set` overrides them.
STUDY_BASE = {"rollout.num_groups": "16", "rollout.group_size": "8", "algo.entropy_coef": "0.001",
              "algo.adam_eps": "1e-8", "algo.lr_decay_fraction": "0"}
# ... and the warm starts it ran from (FrozenLake's default moved to a noisier one, §25).
STUDY_WARM_START = {"sokoban": "builtin:sokoban-tiny", "frozenlake": "builtin:frozenlake-tiny"}
# The study figure's panels (metric, title), left to right.
FIGURE_PANELS = ((st.VAL_SUCCESS, "validation success (fixed levels)"),
                 (st.SUCCESS, "training success (5-step mean)"), (st.MI_ZSCORE, "MI-ZScore (first turn)"))


def study_base(env: str) -> dict[str, str]:
    return {**STUDY_BASE, "model.init": STUDY_WARM_START[env]}


def run_config(env: str, seed: int, overrides: dict[str, str]):
    from ragen_jax import config as config_lib

    config = config_lib.load_config_file(str(CONFIGS[env]))
    return config_lib.apply_overrides(config, {"seed": str(seed), "logging.progress": "false",
                                               "logging.tensorboard": "false", **overrides})


def set_overrides(items: list[str], error) -> dict[str, str]:
    """The `--set KEY=VALUE` items of a benchmark command -> {KEY: VALUE}; an item without "="
    goes to `error` (an argparse parser's: one line, exit 2)."""
    for item in items:
        if "=" not in item:
            error(f"--set {item!r}: expected KEY=VALUE")
    return dict(item.split("=", 1) for item in items)


def finished(workdir: Path, steps: int) -> bool:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return bool(lines) and json.loads(lines[-1])["step"] >= steps


def record_start(start_file: Path, config) -> None:
    """Write the initial policy's validation to `start_file` unless an earlier call did."""
    if not start_file.exists():
        start = initial_validation(config)
        start_file.parent.mkdir(parents=True, exist_ok=True)
        start_file.write_text(json.dumps(start, indent=2))


def initial_validation(config) -> dict[str, float]:
    """Validation metrics of the initial policy (the warm start) on the run's validation levels,
    as training logs them (`reasoning/*` included)."""
    from flax import nnx

    from ragen_jax import distributed, reasoning_check
    from ragen_jax.evaluation import EvalConfig, Validator
    from ragen_jax.experiment import make_experiment

    exp = make_experiment(config)
    e = config.eval
    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt,
                          EvalConfig(num_envs=e.num_envs, samples_per_env=e.samples_per_env,
                                     temperature=e.temperature, seed=e.seed), exp.run.step.rollout, exp.mesh)
    metrics, traj = validator(nnx.state(exp.model))
    metrics.update(reasoning_check.validation_metrics(distributed.to_host(traj), exp.tokenizer, exp.prompt))
    return metrics


def train_one(config, workdir: Path, steps: int) -> None:
    from ragen_jax.train import train

    if finished(workdir, steps):
        print(f"{workdir}: already finished", file=sys.stderr)
        return
    workdir.mkdir(parents=True, exist_ok=True)
    code = train(config, workdir)
    if code not in (0, None):
        raise SystemExit(f"{workdir}: training exited with code {code}")


def validation_overrides(args) -> dict[str, str]:
    """How often and on how many levels × samples per level a run validates; a flag left unset
    (`learn`'s defaults) keeps the config's own value."""
    flags = {"train.val_every": args.val_every, "eval.num_envs": args.eval_episodes,
             "eval.samples_per_env": args.eval_samples}
    return {key: str(value) for key, value in flags.items() if value is not None}


# ----------------------------------------------------------------------------- commands


def learn(args) -> None:
    """The default config per seed; the config's validation (or the flags') before and during."""
    for seed in args.seeds:
        workdir = args.out / args.env / f"seed{seed}"
        overrides = {**validation_overrides(args), **({"train.steps": str(args.steps)} if args.steps else {}),
                     **args.set}
        config = run_config(args.env, seed, overrides)
        host_devices.split_host(config)  # as `python -m ragen_jax.train` does, before jax starts
        record_start(workdir / "start_validation.json", config)
        train_one(config, workdir, config.train.steps)


def study(args) -> None:
    """Every arm (filter × algorithm) for every seed, with the gradient analysis switched on;
    first the initial policy's validation (the same levels and samples for every arm and seed)."""
    record_start(args.out / args.env / "start_validation.json",
                 run_config(args.env, 0, {**study_base(args.env), **validation_overrides(args), **args.set}))
    for seed in args.seeds:
        for filter_name in args.filters:
            for algo in args.algos:
                workdir = args.out / args.env / f"{filter_name}-{algo}" / f"seed{seed}"
                # a checkpoint every 10 steps: an interrupted study repeats at most 10 steps of one run
                overrides = {**study_base(args.env), **FILTERS[filter_name], "algo.name": algo,
                             "train.steps": str(args.steps), "train.save_every": "10",
                             **validation_overrides(args), "grad_buckets": str(args.grad_buckets),
                             "early_stop.val_patience": "0", "early_stop.empty_batches": "0",
                             "early_stop.reward_std_collapse": "0",
                             **args.set}
                train_one(run_config(args.env, seed, overrides), workdir, args.steps)


def ceiling(args) -> None:
    """What any policy could score on the validation levels under the config's turn structure
    (`ragen_jax.ceilings`): FrozenLake's best and shortest-path-replanning success with slip,
    Sokoban's share of levels solvable within the move budget."""
    import jax
    import numpy as np

    from ragen_jax import ceilings
    from ragen_jax.evaluation import EvalConfig
    from ragen_jax.experiment import make_experiment

    config = run_config(args.env, 0, args.set)
    exp = make_experiment(config)
    eval_config = EvalConfig(num_envs=args.eval_episodes, seed=config.eval.seed)
    rollout_config = eval_config.rollout_config(exp.run.step.rollout)
    states = eval_config.start_states(exp.env, exp.env_params, exp.run.step.rollout)
    turns, per_turn, budget = (rollout_config.max_turns, rollout_config.max_actions_per_turn,
                               rollout_config.max_actions_per_traj)
    level = lambda i: jax.tree.map(lambda a: np.asarray(a)[i], states)  # noqa: E731
    header = (f"{args.env}: {args.eval_episodes} validation levels (eval.seed {config.eval.seed}), "
              f"{turns} turns × ≤{per_turn} moves, budget {budget}")
    if args.env == "frozenlake":
        rate = float(exp.env_params.success_rate)
        best, replan = [], []
        for i in range(args.eval_episodes):
            s = level(i)
            best.append(ceilings.frozenlake_optimal(s.holes, s.player, s.goal, rate, turns, per_turn, budget)[0])
            replan.append(ceilings.frozenlake_replanning(s.holes, s.player, s.goal, rate, turns, per_turn, budget))
        print(f"{header}, slip: intended move w.p. {rate:.3f}")
        print(f"  best possible success              {np.mean(best):.3f}")
        print(f"  shortest-path replanning (the demos) {np.mean(replan):.3f}")
    else:
        solvable = [ceilings.sokoban_solvable(s.room_fixed, s.room_state, s.player, budget)
                    for s in map(level, range(args.eval_episodes))]
        print(header)
        print(f"  solvable within the budget (best possible success) {np.mean(solvable):.3f}")


def _records(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _fmt(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def report(args) -> None:
    """Markdown tables on stdout (and a figure per env with --figures) from every run under --out."""
    runs: dict[tuple[str, str], list[list[dict]]] = {}  # (env, arm) -> its seeds' records
    seeds: dict[tuple[str, str], list[list[dict]]] = {}  # (env, seed) -> its arms' records
    for metrics in sorted(args.out.glob("*/*/seed*/metrics.jsonl")) + sorted(args.out.glob("*/seed*/metrics.jsonl")):
        workdir = metrics.parent
        parts = workdir.relative_to(args.out).parts
        env, arm = parts[0], (parts[1] if len(parts) == 3 else "default")
        records = _records(workdir)
        runs.setdefault((env, arm), []).append(records)
        seeds.setdefault((env, parts[-1]), []).append(records)
    if not runs:
        raise SystemExit(f"no runs under {args.out} (expected <env>/<arm>/seed<k>/metrics.jsonl)")
    print(results_tables(runs, args.out, seeds))
    if args.figures:
        for env in sorted({env for env, _ in runs}):
            start_file = args.out / env / "start_validation.json"  # a study's initial policy, shared by its arms
            start = json.loads(start_file.read_text())["success"] if start_file.exists() else None
            path = draw_figure(env, {arm: r for (e, arm), r in runs.items() if e == env}, args.figures, start)
            print(f"\nfigure: {path}")


def results_tables(runs, out: Path, seeds=None) -> str:
    columns = ["first_success", "final_success", "peak_success", "final_mi_zscore", "mean_retrieval_acc",
               "mean_reasoning_entropy", "alarm_rate", "mean_kept_ratio", "mean_step_seconds"]
    lines = ["| env | arm | seeds | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 3)]
    for (env, arm), records in sorted(runs.items()):
        rows = [st.summarise_run(r) for r in records]
        cells = []
        for c in columns:
            values = [row[c] for row in rows if not math.isnan(row[c])]
            mean = sum(values) / len(values) if values else math.nan
            spread = (max(values) - min(values)) / 2 if len(values) > 1 else math.nan
            cells.append(_fmt(mean) + ("" if math.isnan(spread) else f" ± {_fmt(spread)}"))
        lines.append(f"| {env} | {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    starts = sorted(out.glob("**/start_validation.json"))
    if starts:
        lines += ["", "| run | start validation success (initial policy) | end validation success "
                  "| reasoning's player cell right: start → end |", "| --- | ---: | ---: | --- |"]
        for path in starts:
            start = json.loads(path.read_text())
            right = _fmt(start.get("reasoning/player_right", math.nan))
            if not (path.parent / "metrics.jsonl").exists():  # a study's: one initial policy for every arm
                lines.append(f"| {path.parent.relative_to(out)} (initial policy of every arm) | "
                             f"{_fmt(start['success'])} | — | {right} |")
                continue
            end = [r for r in _records(path.parent) if "val/success" in r]
            last = end[-1] if end else {}
            lines.append(f"| {path.parent.relative_to(out)} | {_fmt(start['success'])} | "
                         f"{_fmt(last.get('val/success', math.nan))} | "
                         f"{right} → {_fmt(last.get('val/reasoning/player_right', math.nan))} |")
    # raw: every run's checkpoints pooled (the paper's); centred: each checkpoint minus the mean of
    # the same seed's runs at that step, which drew the same levels (ragen_jax.study)
    lines += ["", "| env | points | Spearman(MI-ZScore, success) | Spearman(reasoning entropy, success) |",
              "| --- | --- | ---: | ---: |"]
    for env in sorted({env for env, _ in runs}):
        all_runs = [r for (e, _), rs in runs.items() if e == env for r in rs]
        env_seeds = [rs for (e, _), rs in sorted((seeds or {}).items()) if e == env]
        rows = [("raw", [st.checkpoint_points(all_runs, key) for key in (st.MI_ZSCORE, st.REASONING_ENTROPY)])]
        if env_seeds:
            rows.append(("centred", [st.centred_checkpoint_points(env_seeds, key)
                                     for key in (st.MI_ZSCORE, st.REASONING_ENTROPY)]))
        for label, ((mx, my), (ex, ey)) in rows:
            lines.append(f"| {env} | {label}, {len(mx)} | {_fmt(st.spearman(mx, my))} | {_fmt(st.spearman(ex, ey))} |")
    for env in sorted({env for env, _ in runs}):
        table = st.gradient_buckets([r for (e, _), rs in runs.items() if e == env for r in rs])
        if table:
            lines += ["", f"Gradient norms by reward-std bucket ({env}; 0 = lowest in-group reward std):", "",
                      "| bucket | groups | task-gradient norm | regularisation-gradient norm | task / reg |",
                      "| ---: | ---: | ---: | ---: | ---: |"]
            for row in table:
                lines.append(f"| {int(row['bucket'])} | {_fmt(row.get('groups', math.nan), 1)} | "
                             f"{_fmt(row.get('task_norm', math.nan), 4)} | {_fmt(row.get('reg_norm', math.nan), 4)} | "
                             f"{_fmt(row.get('task_over_reg', math.nan), 2)} |")
    return "\n".join(lines)


def figure_lines(arms: dict[str, list[list[dict]]], start: float | None = None) -> dict[str, dict[str, tuple]]:
    """{metric: {arm: (steps, values)}} for the study figure: the mean over seeds at each step;
    training success as a 5-step moving average (single steps are noisy); validation success
    from the initial policy's `start` at step 0 when it is known (every arm starts there)."""
    import numpy as np

    lines: dict[str, dict[str, tuple]] = {key: {} for key, _ in FIGURE_PANELS}
    for arm, runs in sorted(arms.items()):
        for key, _ in FIGURE_PANELS:
            by_step: dict[int, list[float]] = {}
            for records in runs:
                for step, v in st.finite_series(records, key):
                    by_step.setdefault(step, []).append(v)
            steps = sorted(by_step)
            values = [float(np.mean(by_step[s])) for s in steps]
            if key == st.SUCCESS and len(values) >= 5:
                values = list(np.convolve(values, np.ones(5) / 5, mode="valid"))
                steps = steps[4:]
            if key == st.VAL_SUCCESS and start is not None:
                steps, values = [0, *steps], [float(start), *values]
            lines[key][arm] = (steps, values)
    return lines


def draw_figure(env: str, arms: dict[str, list[list[dict]]], folder: Path, start: float | None = None) -> Path:
    """Validation success, training success and MI-ZScore over steps, one line per arm (mean
    over seeds at each step). Runs of one seed draw the same levels at each step, so the
    training success of all arms rises and falls together; validation is on fixed levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = figure_lines(arms, start)
    fig, axes = plt.subplots(1, len(FIGURE_PANELS), figsize=(14, 3.6))
    for ax, (key, title) in zip(axes, FIGURE_PANELS):
        for arm, (steps, values) in lines[key].items():
            ax.plot(steps, values, label=arm, marker="o" if key != st.SUCCESS else None, markersize=3)
        ax.set(title=f"{env}: {title}", xlabel="step")
    if start is not None:
        axes[0].axhline(start, color="grey", linestyle=":", linewidth=1, label="initial policy")
    axes[0].legend(fontsize=8)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"study_{env}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("learn", "study"):
        p = sub.add_parser(name)
        p.add_argument("--env", choices=sorted(CONFIGS), required=True)
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--steps", type=int, default=0 if name == "learn" else 40)
        # learn: the config's validation (128 levels × 8 samples every 25 steps for the tiny configs;
        # one sample per level has a standard error of ~0.04, docs/results.md §5); study: the same
        # levels × 2 samples every 10 steps (standard error ~0.03, §10)
        p.add_argument("--val-every", type=int, default=None if name == "learn" else 10)
        p.add_argument("--eval-episodes", type=int, default=None if name == "learn" else 128)
        p.add_argument("--eval-samples", type=int, default=None if name == "learn" else 2,
                       help="samples per validation level (success is over all of them; pass@k too)")
        p.add_argument("--set", action="append", default=[],
                       metavar="KEY=VALUE", help="any other config override, e.g. rollout.num_groups=2")
        if name == "study":
            p.add_argument("--filters", nargs="+", choices=sorted(FILTERS), default=["top_p", "top_k", "none"])
            p.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
            p.add_argument("--grad-buckets", type=int, default=6)
    p = sub.add_parser("ceiling")
    p.add_argument("--env", choices=sorted(CONFIGS), required=True)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--set", action="append", default=[],
                   metavar="KEY=VALUE", help="any other config override, e.g. rollout.max_turns=5")
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--figures", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag in ("eval_episodes", "eval_samples"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')}={value} must be >= 1")
    if hasattr(args, "set"):
        args.set = set_overrides(args.set, parser.error)
    if args.command in ("learn", "study"):
        compile_cache.enable()  # every seed and arm compiles the same programs (jax's backend not started yet)
    {"learn": learn, "study": study, "ceiling": ceiling, "report": report}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
