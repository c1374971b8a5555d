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

The study's parts (every run the tiny config of its env — configs/sokoban_tiny.py, 400 steps;
configs/frozenlake_tiny.py, 140 steps — with the paper's filter: variance mass, and the same
optimiser steps per RL step whatever is kept, `filter.update=paper`):
- main: Top-p 0.9, Top-k matched, no filter × GRPO on both envs and PPO on Sokoban, seeds 0–4.
  Top-k is matched by construction: k = the mean kept fraction of the finished Top-p runs of the
  same env and algorithm × the groups (fixed in `<arm>/matched.json` when its first run starts),
  so Top-k runs after Top-p. Validation on the config's fixed levels (128 × 8 samples) every
  50 (Sokoban) / 20 (FrozenLake) steps, MI diagnostics with 64 samples every 10 steps, so both
  meet at every validation.
- noise: FrozenLake, GRPO, `env.success_rate` ∈ {1, 0.9, 0.8, 0.6, 1/3}, Top-p vs none, seeds
  0–2 (the 0.8 runs are main's: the config's own rate).
- gradients: Sokoban, GRPO and PPO, no filter, entropy coefficient / KL coefficient 0.001 / 0.01
  and 0.01 / 0.1, 50 steps, the gradient analysis (6 buckets) at step 1 and every 5 steps:
  11 measurements × 32 groups, ≈ 58 groups per bucket and run.
- reward_noise: the paper's stochasticity axis. FrozenLake with the paper's 2% slip
  (configs/frozenlake_paper_slip.py), GRPO, `env.reward_noise` ∈ {0, 0.2, 0.5, 0.9} (the chance
  a finished episode's reward is replaced by one drawn from the batch), Top-p vs none, seeds
  0–3, seed by seed (every rate gets a seed before any rate gets the next).
- recorded: the 40-step study recorded in docs/results.md ("The recorded study"), as it ran then.

Every run is an ordinary `ragen_jax.train` run in `<out>/<env>/<arm>/seed<k>` (metrics.jsonl,
checkpoints every 10 steps), so a stopped study resumes where it stopped: finished runs are
skipped, interrupted ones resume from their last checkpoint. After every arm `<out>/report.md`
is rewritten from the finished runs, so each table lands as soon as its runs are done. The
statistics live in `ragen_jax.analysis.study` (tested against independent references).
With `--jobs N` (`job_pool.py`) each run is this script for that run alone, N at a time, its
output in `<out>/logs/`; runs of an env start once its first run has validated the initial
policy, a seed once the first run of its arm has trained a step (its programs are then in the
compilation cache), and Top-k once the Top-p runs it is matched to are done.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from fractions import Fraction
from pathlib import Path

from ragen_jax.analysis import study as st  # numpy only; the jax-heavy imports stay inside the commands
from ragen_jax.core import compile_cache, host_devices, quiet

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"sokoban": ROOT / "configs" / "sokoban_tiny.py", "frozenlake": ROOT / "configs" / "frozenlake_tiny.py",
           "frozenlake_paper": ROOT / "configs" / "frozenlake_paper_slip.py"}
ALGOS = ("ppo", "grpo")
# main: the (env, algorithm) pairs the study runs (the issue's: GRPO on both, PPO on Sokoban)
MAIN = (("sokoban", "grpo"), ("sokoban", "ppo"), ("frozenlake", "grpo"))
# The arms' filters; Top-k's k is matched to Top-p's kept fraction when it runs (`matched_top_k`).
FILTERS = {
    "top_p": {"filter.strategy": "top_p", "filter.rho": "0.9"},
    "top_k": {"filter.strategy": "top_k_abs"},
    "none": {"filter.strategy": "none"},
}
# Every run of the study: the paper's score and update, no early stop (every run its full
# length), a checkpoint every 10 steps (a restart repeats at most 10 steps), 64 MI samples.
STUDY_RUN = {"filter.metric": "reward_var", "filter.update": "paper", "train.save_every": "10",
             "early_stop.val_patience": "0", "early_stop.empty_batches": "0", "early_stop.reward_std_collapse": "0",
             "diagnostics.num_samples": "64", "diagnostics.compute_freq": "10"}
VAL_EVERY = {"sokoban": 50, "frozenlake": 20, "frozenlake_paper": 20}  # multiples of compute_freq: MI and validation meet
NOISE_RATES = ("1", "0.9", "0.8", "0.6", "1/3")
REWARD_NOISE = ("0", "0.2", "0.5", "0.9")
REGULARISATION = ("0.001:0.01", "0.01:0.1")  # entropy coefficient : KL coefficient
GRADIENT_STEPS = 50
SEEDS = {"main": [0, 1, 2, 3, 4], "noise": [0, 1, 2], "gradients": [0], "recorded": [0, 1, 2],
         "reward_noise": [0, 1, 2, 3]}
# The recorded 40-step study (docs/results.md, "The recorded study") ran on the tiny defaults of its time:
# 16 groups × 8 with the entropy bonus, optax's Adam ε, a constant rate, these warm starts, Top-k
# keeping a quarter of the groups, Top-p on the reward std, full minibatches and fewer steps.
STUDY_BASE = {"rollout.num_groups": "16", "rollout.group_size": "8", "algo.entropy_coef": "0.001",
              "algo.adam_eps": "1e-8", "algo.lr_decay_fraction": "0"}
STUDY_WARM_START = {"sokoban": "builtin:sokoban-tiny", "frozenlake": "builtin:frozenlake-tiny"}
RECORDED_FILTERS = {
    "top_p": {"filter.strategy": "top_p", "filter.rho": "0.9"},
    "top_k": {"filter.strategy": "top_k", "filter.rho": "0.25"},
    "none": {"filter.strategy": "none"},
}
RECORDED_FILTER = {"filter.metric": "reward_std", "filter.update": "fewer_steps"}
# The study figure's panels (metric, title), left to right.
FIGURE_PANELS = ((st.VAL_SUCCESS, "validation success (fixed levels)"),
                 (st.SUCCESS, "training success (5-step mean)"), (st.MI_ZSCORE, "MI-ZScore (first turn)"))


def study_base(env: str) -> dict[str, str]:
    """The recorded study's base settings (its tiny defaults and warm start)."""
    return {**STUDY_BASE, "model.init": STUDY_WARM_START[env]}


def run_config(env: str, seed: int, overrides: dict[str, str]):
    from ragen_jax.run import config as config_lib

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


def config_command(description: str, steps: int) -> argparse.ArgumentParser:
    """A parser for benchmarks that time one config: `--config`, `--steps` (timed steps after
    the first, default `steps`) and `--set KEY=VALUE` overrides."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=str(ROOT / "configs" / "sokoban_tiny.py"))
    parser.add_argument("--steps", type=int, default=steps, help=f"timed steps after the first (default {steps})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser


def command_config(parser: argparse.ArgumentParser, args, extra: dict[str, str] | None = None):
    """The config of a `config_command`'s arguments (plus `extra` overrides); a bad value ends the
    command with one line (exit 2)."""
    from ragen_jax.run import config as config_lib

    if args.steps < 1:
        parser.error(f"--steps={args.steps} must be >= 1")
    overrides = {**set_overrides(args.set, parser.error), **(extra or {})}
    try:
        return config_lib.apply_overrides(config_lib.load_config_file(args.config), overrides)
    except (config_lib.ConfigError, ValueError) as err:
        parser.error(str(err).splitlines()[0])


def last_step(workdir: Path) -> int:
    """The last step the run in `workdir` logged, -1 if none (a line still being written, by a
    run of a parallel study, does not count)."""
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    try:
        return json.loads(lines[-1])["step"] if lines else -1
    except json.JSONDecodeError:
        return json.loads(lines[-2])["step"] if len(lines) > 1 else -1


def finished(workdir: Path, steps: int) -> bool:
    """Whether the run in `workdir` logged step `steps`."""
    return last_step(workdir) >= steps


def run_finished(workdir: Path) -> bool:
    """Whether the run in `workdir` logged its config's last step (no config: not started)."""
    config = workdir / "config.json"
    return config.exists() and finished(workdir, json.loads(config.read_text())["train"]["steps"])


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file, so a parallel reader sees all of it or none."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


def record_start(start_file: Path, config) -> None:
    """Write the initial policy's validation to `start_file` unless an earlier call did."""
    if not start_file.exists():
        start = initial_validation(config)
        start_file.parent.mkdir(parents=True, exist_ok=True)
        write_whole(start_file, json.dumps(start, indent=2))


def initial_validation(config) -> dict[str, float]:
    """Validation metrics of the initial policy (the warm start) on the run's validation levels,
    as training logs them (`reasoning/*` included)."""
    from flax import nnx

    from ragen_jax.diagnostics import reasoning_check
    from ragen_jax.core import distributed
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.validation import Validator

    exp = make_experiment(config)
    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, exp.run.settings.eval,
                          exp.run.step.rollout, exp.mesh)
    metrics, traj = validator(nnx.state(exp.model))
    metrics.update(reasoning_check.validation_metrics(distributed.to_host(traj), exp.tokenizer))
    return metrics


def train_one(config, workdir: Path, steps: int) -> None:
    from ragen_jax.run.loop import train

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


def rates(texts) -> list[float]:
    """`--rates` items (decimals or fractions like 1/3) as floats."""
    return [float(Fraction(t)) for t in texts]


def regularisation(texts) -> list[tuple[str, str]]:
    """`--reg ENTROPY:KL` items as (entropy coefficient, KL coefficient) strings."""
    return [tuple(t.split(":", 1)) for t in texts]


def study_overrides(env: str, args) -> dict[str, str]:
    """What every run of the study's main and noise parts gets, before its arm's own keys."""
    return {**STUDY_RUN, "diagnostics.num_samples": str(args.diag_samples),
            "train.val_every": str(VAL_EVERY[env]), **validation_overrides(args),
            **({"train.steps": str(args.steps)} if args.steps else {})}


def run_arm(args, env: str, arm: str, seeds, overrides: dict[str, str]) -> None:
    """One arm's runs, seed by seed; then the report is rewritten."""
    for seed in seeds:
        config = run_config(env, seed, {**overrides, **args.set})
        train_one(config, args.out / env / arm / f"seed{seed}", config.train.steps)
    write_report(args.out)


def finished_runs(arm_dir: Path) -> list[list[dict]]:
    """The records of every finished run (last logged step = its config's train.steps) of an arm."""
    return [_records(workdir) for workdir in sorted(arm_dir.glob("seed*")) if run_finished(workdir)]


def matched_k(args, env: str, algo: str, num_groups: int) -> int:
    """Top-k's group count for env/algo: fixed in `top_k-<algo>/matched.json` when first asked,
    from the finished Top-p runs of the same env and algorithm then (so every Top-k seed keeps
    the same k, and a resumed Top-k run finds the config it started with)."""
    path = args.out / env / f"top_k-{algo}" / "matched.json"
    if path.exists():
        return json.loads(path.read_text())["k"]
    top_p = finished_runs(args.out / env / f"top_p-{algo}")
    if not top_p:
        raise SystemExit(f"Top-k on {env}/{algo} is matched to finished Top-p runs, and there are none under "
                         f"{args.out / env / f'top_p-{algo}'}: run --filters top_p first (the default order does)")
    kept = [st.summarise_run(r)["mean_kept_ratio"] for r in top_p]
    k = st.matched_top_k(kept, num_groups)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps({"k": k, "groups": num_groups, "top_p_runs": len(top_p),
                                  "top_p_mean_kept_fraction": sum(kept) / len(kept)}, indent=2))
    return k


def main_part(args) -> None:
    """Top-p, then no filter, then Top-k matched to Top-p's kept fraction, per env/algorithm;
    first the initial policy's validation (the same levels for every arm and seed)."""
    for env, algo in MAIN:
        if env not in args.envs or algo not in args.algos:
            continue
        base = {**study_overrides(env, args), "algo.name": algo}
        record_start(args.out / env / "start_validation.json", run_config(env, 0, {**base, **args.set}))
        for name in [f for f in ("top_p", "none", "top_k") if f in args.filters]:
            overrides = {**base, **FILTERS[name]}
            if name == "top_k":
                groups = run_config(env, 0, {**base, **args.set}).rollout.num_groups
                overrides["filter.rho"] = str(matched_k(args, env, algo, groups))
            run_arm(args, env, f"{name}-{algo}", args.seeds or SEEDS["main"], overrides)


def config_success_rate() -> float:
    """The noise env's own `env.success_rate`: its arms are main's (no `-success` suffix)."""
    return run_config(ENVS["noise"][0], 0, {}).env.success_rate


def noise_arms(args) -> list[tuple[str, dict[str, str]]]:
    """(arm, overrides) of the stochasticity sweep: FrozenLake, GRPO, Top-p and no filter at each
    `env.success_rate`; the config's own rate is main's arm (the same runs)."""
    default = config_success_rate()
    arms = []
    for rate in rates(args.rates):
        for name in [f for f in ("top_p", "none") if f in args.filters]:
            suffix = "" if rate == default else f"-success{rate:.3g}"
            arms.append((f"{name}-grpo{suffix}", {**study_overrides("frozenlake", args), "algo.name": "grpo",
                                                   **FILTERS[name], "env.success_rate": repr(rate)}))
    return arms


def noise_part(args) -> None:
    for arm, overrides in noise_arms(args):
        run_arm(args, "frozenlake", arm, args.seeds or SEEDS["noise"], overrides)


def reward_noise_arms(args) -> list[tuple[str, dict[str, str]]]:
    """(arm, overrides) of the paper's stochasticity axis: GRPO, Top-p and no filter at each
    `env.reward_noise` on the paper's lake."""
    env = ENVS["reward_noise"][0]
    return [(f"{name}-grpo-rnoise{q}", {**study_overrides(env, args), "algo.name": "grpo", **FILTERS[name],
                                          "env.reward_noise": q})
            for q in args.reward_noise for name in ("top_p", "none") if name in args.filters]


def reward_noise_part(args) -> None:
    """Seed by seed: a first paired seed at every rate before any rate gets a second."""
    env = ENVS["reward_noise"][0]
    record_start(args.out / env / "start_validation.json", run_config(env, 0, {**study_overrides(env, args),
                                                                              **args.set}))
    for seed in args.seeds or SEEDS["reward_noise"]:
        for arm, overrides in reward_noise_arms(args):
            run_arm(args, env, arm, [seed], overrides)


def gradient_arms(args) -> list[tuple[str, str, dict[str, str]]]:
    """(env, arm, overrides) of the gradient analysis: no filter (every group trains, as measured),
    each algorithm at each regularisation strength, no MI diagnostics or validation (the
    analysis runs at step 1 and every 5 steps without them)."""
    arms = []
    for env in args.envs:
        for algo in args.algos:
            for entropy, kl in regularisation(args.reg):
                arms.append((env, f"none-{algo}-ent{entropy}-kl{kl}", {
                    **STUDY_RUN, **FILTERS["none"], "algo.name": algo, "algo.entropy_coef": entropy,
                    "algo.kl_coef": kl, "grad_buckets": str(args.grad_buckets), "diagnostics.enabled": "false",
                    "train.val_every": "0", "train.steps": str(args.steps or GRADIENT_STEPS)}))
    return arms


def gradients_part(args) -> None:
    for env, arm, overrides in gradient_arms(args):
        run_arm(args, env, arm, args.seeds or SEEDS["gradients"], overrides)


def recorded_part(args) -> None:
    """The 40-step study of docs/results.md ("The recorded study") as it ran: its base settings and
    warm starts, Top-p on the reward std, Top-k keeping a quarter of the groups, fewer optimiser
    steps when fewer groups are kept, the gradient analysis on, validation on 128 levels × 2 every 10 steps."""
    val = {"train.val_every": str(args.val_every or 10), "eval.num_envs": str(args.eval_episodes or 128),
           "eval.samples_per_env": str(args.eval_samples or 2)}
    for env in args.envs:
        record_start(args.out / env / "start_validation.json", run_config(env, 0, {**study_base(env), **val, **args.set}))
        for seed in args.seeds or SEEDS["recorded"]:
            for name in args.filters:
                for algo in args.algos:
                    overrides = {**study_base(env), **RECORDED_FILTER, **RECORDED_FILTERS[name], "algo.name": algo,
                                 "train.steps": str(args.steps or 40), "train.save_every": "10", **val,
                                 "grad_buckets": str(args.grad_buckets), "early_stop.val_patience": "0",
                                 "early_stop.empty_batches": "0", "early_stop.reward_std_collapse": "0", **args.set}
                    train_one(run_config(env, seed, overrides), args.out / env / f"{name}-{algo}" / f"seed{seed}",
                              args.steps or 40)


PARTS = {"main": main_part, "noise": noise_part, "gradients": gradients_part, "recorded": recorded_part,
         "reward_noise": reward_noise_part}
PAPER_MID_RANGE = (0.05, 0.5)  # the random-reward fractions where the paper finds filtering helps most
ENVS = {"main": ["sokoban", "frozenlake"], "noise": ["frozenlake"], "gradients": ["sokoban"],
        "recorded": ["sokoban", "frozenlake"], "reward_noise": ["frozenlake_paper"]}


def job_flags(args) -> list[str]:
    """The flags every run of a parallel study passes on, beside its own selection."""
    flags = ["--out", str(args.out), "--steps", str(args.steps), "--grad-buckets", str(args.grad_buckets),
             "--diag-samples", str(args.diag_samples)]
    for flag in ("val_every", "eval_episodes", "eval_samples"):
        if getattr(args, flag) is not None:
            flags += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return flags + [a for key, value in args.set.items() for a in ("--set", f"{key}={value}")]


def job_environment(args, env: str) -> dict[str, str]:
    """A run's environment in a parallel study: the host's cores shared out (one jax CPU device per
    core of its share) and, on a GPU, memory taken as needed so the runs fit on one card."""
    environ = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    host_devices.split_host(run_config(env, 0, args.set), cores=max(1, (os.cpu_count() or 1) // args.jobs),
                            environ=environ)
    return environ


def study_jobs(args, parts) -> list:
    """Every unfinished run of `parts` as a job of `job_pool`: this script for that run alone.
    A run waits for the first run of its arm to have trained a step (its programs are then in the
    compilation cache, so it starts without compiling) and, in the main part, for its env's
    initial validation (the env's first run writes it); either stops holding it back once that
    run has ended. Top-k runs wait for the Top-p runs of their env and algorithm, and k is fixed
    before the first of them starts."""
    from job_pool import Job

    script, flags, jobs = str(Path(__file__).resolve()), job_flags(args), []
    names: dict[Path, str] = {}
    first_of: dict[str, Path] = {}  # an arm ("env/arm") or an env's main part -> its first run

    def after_first(key: str, workdir: Path, done):
        """A `ready` for the runs after the first of `key`: that run is `done` (or ended)."""
        first = first_of.setdefault(key, workdir)
        return lambda ended: first == workdir or done(first) or names[first] in ended

    def add(part, env, arm, seed, selection, after=(), before=lambda: None) -> str | None:
        """Plan the run (its name), unless it is planned already (noise's rate 0.8 is main's) or finished."""
        workdir = args.out / env / arm / f"seed{seed}"
        if workdir in names or run_finished(workdir):
            return None
        names[workdir] = f"{env}/{arm}/seed{seed}"
        compiled = after_first(f"{env}/{arm}", workdir, lambda first: last_step(first) >= 1)
        validated = after_first(f"{env}/main", workdir, lambda _: (args.out / env / "start_validation.json").exists())
        ready = (lambda ended: compiled(ended) and validated(ended)) if part == "main" else compiled
        jobs.append(Job(names[workdir], [sys.executable, script, "study", "--part", part, *selection,
                                         "--seeds", str(seed), *flags],
                        args.out / "logs" / f"{env}-{arm}-seed{seed}.log", tuple(after), ready, before,
                        job_environment(args, env)))
        return names[workdir]

    for part in parts:
        for env in args.envs or ENVS[part]:
            if part == "main":
                for algo in [a for e, a in MAIN if e == env and a in args.algos]:
                    base = {**study_overrides(env, args), "algo.name": algo, **args.set}
                    top_p = []
                    for name in [f for f in ("top_p", "none", "top_k") if f in args.filters]:
                        for seed in args.seeds or SEEDS["main"]:
                            fix_k = (lambda e=env, a=algo, b=base:
                                     matched_k(args, e, a, run_config(e, 0, b).rollout.num_groups))
                            planned = add("main", env, f"{name}-{algo}", seed,
                                          ["--envs", env, "--algos", algo, "--filters", name],
                                          after=top_p if name == "top_k" else (),
                                          before=fix_k if name == "top_k" else (lambda: None))
                            if name == "top_p" and planned:
                                top_p.append(planned)
            elif part == "noise" and env == "frozenlake":  # the sweep is FrozenLake's slip
                for rate in args.rates:
                    for name in [f for f in ("top_p", "none") if f in args.filters]:
                        one = argparse.Namespace(**{**vars(args), "rates": [rate], "filters": [name]})
                        [(arm, _)] = noise_arms(one)
                        for seed in args.seeds or SEEDS["noise"]:
                            add("noise", env, arm, seed, ["--rates", rate, "--filters", name])
            elif part == "gradients":
                for algo in args.algos:
                    for reg in args.reg:
                        [(_, arm, _)] = gradient_arms(argparse.Namespace(
                            **{**vars(args), "envs": [env], "algos": [algo], "reg": [reg]}))
                        for seed in args.seeds or SEEDS["gradients"]:
                            add("gradients", env, arm, seed, ["--envs", env, "--algos", algo, "--reg", reg])
    return jobs


def study_in_parallel(args, parts) -> None:
    """The runs of `parts` as `args.jobs` processes at a time; the report once they are done."""
    from job_pool import Stopped, run_jobs

    try:
        codes = run_jobs(study_jobs(args, parts), args.jobs, say=lambda line: print(line, flush=True))
    except Stopped as stop:
        write_report(args.out)
        print(f"stopped: the runs that were running ({', '.join(stop.jobs) or 'none'}) got SIGTERM and ended, "
              "each after saving a checkpoint; the same command resumes the study", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    write_report(args.out)
    failed = sorted(name for name, code in codes.items() if code != 0)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(codes)} runs did not finish: {', '.join(failed)} "
                         f"(their logs: {args.out / 'logs'})")


def study(args) -> None:
    """The asked part, or main, noise and gradients in turn (`all`); `--jobs N`: N runs at a time."""
    parts = ("main", "noise", "gradients") if args.part == "all" else (args.part,)
    if args.jobs > 1:
        return study_in_parallel(args, parts)
    # as `python -m ragen_jax.train` does, before jax starts: one device per core (the study's runs
    # share their env config's rollout batch and minibatch); the recorded study ran on one device
    if parts != ("recorded",):
        host_devices.split_host(run_config((args.envs or ENVS[parts[0]])[0], 0, args.set))
    for part in parts:
        PARTS[part](argparse.Namespace(**{**vars(args), "envs": args.envs or ENVS[part]}))


def ceiling(args) -> None:
    """What any policy could score on the validation levels under the config's turn structure
    (`ragen_jax.analysis.ceilings`): FrozenLake's best and shortest-path-replanning success with slip,
    Sokoban's share of levels solvable within the move budget."""
    import jax
    import numpy as np

    from ragen_jax.analysis import ceilings
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.validation import EvalConfig

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
        solvable = [ceilings.solvable(exp.env, level(i), exp.env_params, budget) for i in range(args.eval_episodes)]
        print(header)
        print(f"  solvable within the budget (best possible success) {np.mean(solvable):.3f}")


def _records(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _fmt(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _signed(value: float, digits: int = 3) -> str:
    return "—" if math.isnan(value) else f"{value:+.{digits}f}"


def _interval(low: float, high: float, digits: int = 3) -> str:
    return "—" if math.isnan(low) else f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def load_runs(out: Path) -> dict[tuple[str, str], dict[int, list[dict]]]:
    """{(env, arm): {seed: records}} of every finished run under `out` (a study's
    `<env>/<arm>/seed<k>` or learn's `<env>/seed<k>`, arm "default"); unfinished runs are left out."""
    runs: dict[tuple[str, str], dict[int, list[dict]]] = {}
    for metrics in sorted(out.glob("*/*/seed*/metrics.jsonl")) + sorted(out.glob("*/seed*/metrics.jsonl")):
        workdir = metrics.parent
        parts = workdir.relative_to(out).parts
        if not run_finished(workdir):
            continue
        env, arm = parts[0], (parts[1] if len(parts) == 3 else "default")
        runs.setdefault((env, arm), {})[int(parts[-1][len("seed"):])] = _records(workdir)
    return runs


def report(args) -> None:
    """Markdown tables on stdout (and a figure per env with --figures) from the finished runs under --out."""
    runs = load_runs(args.out)
    if not runs:
        raise SystemExit(f"no finished runs under {args.out} (expected <env>/<arm>/seed<k>/metrics.jsonl)")
    print(report_text(runs, args.out))
    if args.figures:
        for env in sorted({env for env, _ in runs}):
            start_file = args.out / env / "start_validation.json"  # a study's initial policy, shared by its arms
            start = json.loads(start_file.read_text())["success"] if start_file.exists() else None
            arms = {arm: list(seeds.values()) for (e, arm), seeds in runs.items() if e == env and "-" in arm
                    and arm.split("-", 1)[1] in ALGOS}  # main's arms: one line each
            if arms:
                path = draw_figure(env, arms, args.figures, start)
                print(f"\nfigure: {path}")


def write_report(out: Path) -> None:
    """`<out>/report.md` from the runs finished so far (the study calls it after every run)."""
    runs = load_runs(out)
    if runs:
        write_whole(out / "report.md", report_text(runs, out) + "\n")


def report_text(runs, out: Path) -> str:
    return "\n\n".join(part for part in (arm_table(runs), start_table(out), claims_table(runs), noise_trend(runs),
                                          reward_noise_trend(runs),
                                          predictors_table(runs), gradients_table(runs)) if part)


def arm_table(runs) -> str:
    """Per arm, over its finished seeds: mean with the seeds' range."""
    columns = ["final_validation", "first_success", "peak_success", "final_mi_zscore", "mean_retrieval_acc",
               "mean_kept_ratio", "mean_step_seconds"]
    lines = ["Per arm (finished seeds; mean, and the seeds' range). final_validation: the mean of a run's last "
             "3 validations.", "", "| env | arm | seeds | " + " | ".join(columns) + " |",
             "|" + " --- |" * (len(columns) + 3)]
    for (env, arm), seeds in sorted(runs.items()):
        rows = [{**st.summarise_run(r), "final_validation": st.final_validation(r)} for r in seeds.values()]
        cells = []
        for c in columns:
            values = [row[c] for row in rows if not math.isnan(row[c])]
            mean = sum(values) / len(values) if values else math.nan
            spread = f" ({_fmt(min(values))}–{_fmt(max(values))})" if len(values) > 1 else ""
            cells.append(_fmt(mean) + spread)
        lines.append(f"| {env} | {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def start_table(out: Path) -> str:
    starts = sorted(out.glob("**/start_validation.json"))
    if not starts:
        return ""
    lines = ["| run | start validation success (initial policy) | end validation success "
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
    return "\n".join(lines)


COMPARISONS = (("top_p", "none"), ("top_p", "top_k"), ("top_k", "none"))


def claims_table(runs) -> str:
    """Paired per-seed differences of final validation success between filters that share
    everything else (the arm's name after the filter), with bootstrap and t 95% intervals over
    seeds; a verdict only where both intervals lie on one side of 0."""
    finals = {key: {seed: st.final_validation(r) for seed, r in seeds.items()} for key, seeds in runs.items()}
    lines = ["Claims: arm A − arm B in final validation success (fixed levels), per seed (the same seed in "
             "both), with 95% intervals of the mean over seeds: the bootstrap's and Student's t (the bootstrap's "
             "is too narrow for a few seeds); the verdict needs both to exclude 0.", "",
             "| env | condition | A − B | seeds | per-seed differences | mean | bootstrap 95% | t 95% | verdict |",
             "| --- | --- | --- | ---: | --- | ---: | --- | --- | --- |"]
    rows = 0
    for env, condition in sorted({(env, arm.split("-", 1)[1]) for env, arm in runs if "-" in arm}):
        for a, b in COMPARISONS:
            if (env, f"{a}-{condition}") not in finals or (env, f"{b}-{condition}") not in finals:
                continue
            seeds, diffs = st.paired_differences(finals[env, f"{a}-{condition}"], finals[env, f"{b}-{condition}"])
            if not seeds:
                continue
            mean, low, high = st.mean_difference_interval(diffs)
            _, t_low, t_high = st.mean_t_interval(diffs)
            per_seed = ", ".join(f"{s}: {d:+.3f}" for s, d in zip(seeds, diffs))
            bounds = (low, high, t_low, t_high)
            wider = ((min(low, t_low), max(high, t_high)) if all(map(math.isfinite, bounds))
                     else (math.nan, math.nan))  # no verdict without both intervals
            lines.append(f"| {env} | {condition} | {a} − {b} | {len(seeds)} | {per_seed} | {mean:+.3f} | "
                         f"{_interval(low, high)} | {_interval(t_low, t_high)} | "
                         f"{st.verdict(*wider, f'{a} better', f'{b} better')} |")
            rows += 1
    return "\n".join(lines) if rows else ""


def noise_trend(runs) -> str:
    """The stochasticity claim over all the noise part's rates at once: the slope of Top-p − no
    filter (per seed, final validation) against the slip, 1 − `env.success_rate`, with its t
    interval. The config's own rate is main's arms (no suffix), as in `noise_arms`."""
    env, default = ENVS["noise"][0], config_success_rate()
    slips, diffs = [], []
    for e, arm in sorted(runs):
        suffix = arm[len("top_p-grpo"):]
        partner = "none-grpo" + suffix
        if (e != env or not arm.startswith("top_p-grpo") or (suffix and not suffix.startswith("-success"))
                or (env, partner) not in runs):
            continue
        rate = float(suffix[len("-success"):]) if suffix else default
        _, pairs = st.paired_differences(*({seed: st.final_validation(r) for seed, r in runs[env, key].items()}
                                           for key in (arm, partner)))
        slips += [1.0 - rate] * len(pairs)
        diffs += pairs.tolist()
    if len(set(slips)) < 2:
        return ""
    slope, low, high = st.slope_t_interval(slips, diffs)
    return (f"Stochasticity ({env}, GRPO): Top-p − none against the slip (1 − env.success_rate) over "
            f"{len(diffs)} seed pairs at {len(set(slips))} rates: slope {_signed(slope)} per unit of slip, "
            f"t 95% {_interval(low, high)}: " + st.verdict(low, high, "the filter's difference rises with the slip",
                                                          "the filter's difference falls with the slip"))


def reward_noise_trend(runs) -> str:
    """The paper's stochasticity axis at once: Top-p − no filter (per seed, final validation)
    against `env.reward_noise`: the mean difference per rate with its t interval and its t test's
    p, the paper's claim as one contrast (the paper's 5–50% rates minus the others, per seed at
    every rate), and the slope (p's unadjusted: Holm's correction is over the claims)."""
    env, slug = ENVS["reward_noise"][0], "-rnoise"
    per_rate = {}
    for e, arm in sorted(runs):
        if e != env or not arm.startswith("top_p-grpo" + slug) or (env, "none" + arm[len("top_p"):]) not in runs:
            continue
        q = float(arm.rsplit(slug, 1)[1])
        seeds, pairs = st.paired_differences(*({seed: st.final_validation(r) for seed, r in runs[env, key].items()}
                                               for key in (arm, "none" + arm[len("top_p"):])))
        per_rate[q] = dict(zip(seeds, pairs.tolist()))
    if not per_rate:
        return ""
    noise = [q for q, d in per_rate.items() for _ in d]
    diffs = [v for d in per_rate.values() for v in d.values()]

    def tested(d):
        mean, low, high = st.mean_t_interval(d)
        p = st.mean_t_p(d)
        return (f"{mean:+.3f} ({len(d)} seeds)" + ("" if math.isnan(low) else f", t 95% {_interval(low, high)}")
                + ("" if math.isnan(p) else f", p {p:.2g}"))

    rates = "; ".join(f"q = {q:g}: {tested(list(d.values()))}" for q, d in sorted(per_rate.items()))
    text = f"Random rewards ({env}, GRPO): Top-p − none, mean per rate: {rates}."
    seeds, contrast = st.mid_minus_ends(per_rate, *PAPER_MID_RANGE)
    if len(seeds) >= 2:
        mean, low, high = st.mean_t_interval(contrast)
        text += (f" Mid-range ({PAPER_MID_RANGE[0]:g} ≤ q ≤ {PAPER_MID_RANGE[1]:g}) − the other rates, per seed at "
                 f"every rate: {tested(contrast)}: " + st.verdict(low, high, "the gain peaks mid-range",
                                                                  "the gain is lower mid-range") + ".")
    if len(set(noise)) < 2 or len(diffs) < 3:
        return text
    slope, low, high = st.slope_t_interval(noise, diffs)
    return (text + f" Slope over {len(diffs)} seed pairs: {_signed(slope)} per unit of reward noise, t 95% "
            f"{_interval(low, high)}: " + st.verdict(low, high, "the filter's difference rises with the noise",
                                                     "the filter's difference falls with the noise"))


def predictors_table(runs) -> str:
    """Per env: each MI proxy and entropy against validation success, pooled over every finished
    run with both (main and noise), intervals by resampling runs; then whether first-turn
    MI-ZScore predicts better than each entropy (|ρ| difference on the same resamples). Each
    also centred on the step: runs that all improve make the raw correlation measure training
    progress; centred, it compares runs at the same step."""
    lines = []
    for env in sorted({env for env, _ in runs}):
        env_runs = [r for (e, _), seeds in sorted(runs.items()) if e == env for r in seeds.values()]
        rows = []
        for key, against, name, above, below in (
                *((key, None, key, "positive", "negative") for key in (*st.MI_PROXIES, *st.ENTROPIES)),
                *((st.MI_ZSCORE, entropy, f"\\|ρ(MI-ZScore)\\| − \\|ρ({entropy.rsplit('/', 1)[1]})\\|",
                   "MI-ZScore predicts better", "the entropy predicts better") for entropy in st.ENTROPIES)):
            rho, low, high, points, n = st.run_correlation(env_runs, key, against=against)
            if not points:
                continue
            c_rho, c_low, c_high, _, _ = st.run_correlation(env_runs, key, against=against, centre=True)
            rows.append(f"| {name} | {points} | {n} | {_signed(rho)} | {_interval(low, high)} | "
                        f"{st.verdict(low, high, above, below)} | {_signed(c_rho)} | {_interval(c_low, c_high)} | "
                        f"{st.verdict(c_low, c_high, above, below)} |")
        if rows:
            lines += [f"Diagnostics vs validation success ({env}; Spearman over the validation steps of every "
                      "finished run, pooled, and the same with both sides centred on the step's mean over the "
                      "runs; 95% intervals by resampling runs):", "",
                      "| predictor | points | runs | Spearman | 95% interval | sign | centred | 95% interval | sign |",
                      "| --- | ---: | ---: | ---: | --- | --- | ---: | --- | --- |", *rows, ""]
    return "\n".join(lines).strip()


def gradients_table(runs) -> str:
    """Per (env, arm) with a gradient analysis: the norms by reward-std bucket, and the
    regulariser's share of the gradient (`reg_share`) in the lowest and highest bucket with
    intervals over the measured steps."""
    lines = []
    for (env, arm), seeds in sorted(runs.items()):
        table = st.gradient_buckets(list(seeds.values()))
        if not table:
            continue
        lines += ["", f"Gradient norms by reward-std bucket ({env}, {arm}; 0 = lowest in-group reward std; "
                  "groups: pooled over the measured steps of its runs):", "",
                  "| bucket | steps | groups | task-gradient norm | regularisation-gradient norm | reg / (reg + task) |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        steps = st.measured_steps(seeds.values())
        for row in table:
            task, reg = row.get("task_norm", math.nan), row.get("reg_norm", math.nan)
            lines.append(f"| {int(row['bucket'])} | {_fmt(row.get('measurements', math.nan), 0)} | "
                         f"{_fmt(row.get('groups_total', math.nan), 0)} | {_fmt(task, 4)} | {_fmt(reg, 4)} | "
                         f"{_fmt(st.reg_share(steps, int(row['bucket'])), 3)} |")
        low_bucket, high_bucket = int(table[0]["bucket"]), int(table[-1]["bucket"])
        share = lambda b: (lambda steps_: st.reg_share(steps_, b))  # noqa: E731
        cells = []
        for name, statistic in ((f"the regulariser's share in bucket {low_bucket}", share(low_bucket)),
                                (f"in bucket {high_bucket}", share(high_bucket)),
                                ("difference", lambda s: share(low_bucket)(s) - share(high_bucket)(s))):
            value, low, high = st.bootstrap_interval(steps, statistic)
            cells.append(f"{name} {_fmt(value)} {_interval(low, high)}")
        # the last interval is the difference's
        lines += ["", "; ".join(cells) + f" (95% intervals over the {len(steps)} measured steps): "
                  + st.verdict(low, high, "the regulariser weighs more in the low-variance groups",
                               "the regulariser weighs more in the high-variance groups")]
    return "\n".join(lines).strip()


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
                for step, v in st.finite_series(st.trained(records), key):  # step 0: `start`, the same for all
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


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("learn", "study"):
        p = sub.add_parser(name)
        if name == "learn":
            p.add_argument("--env", choices=sorted(CONFIGS), required=True)
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        else:
            p.add_argument("--part", choices=["all", *PARTS], default="all",
                           help="all: main, noise and gradients in turn; reward_noise: the random-reward axis; recorded: the 40-step study of "
                                "docs/results.md as it ran")
            p.add_argument("--envs", nargs="+", choices=sorted(CONFIGS), default=None,
                           help="default: the part's (main: both; noise: frozenlake; gradients: sokoban)")
            p.add_argument("--seeds", type=int, nargs="+", default=None,
                           help="default: main 0-4, noise 0-2, gradients 0, recorded 0-2")
            p.add_argument("--filters", nargs="+", choices=sorted(FILTERS), default=["top_p", "none", "top_k"])
            p.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
            p.add_argument("--rates", nargs="+", default=list(NOISE_RATES),
                           help="noise: FrozenLake's env.success_rate values (decimals or fractions)")
            p.add_argument("--reward-noise", nargs="+", default=list(REWARD_NOISE),
                           help="reward_noise: the env.reward_noise values, in [0, 1]")
            p.add_argument("--reg", nargs="+", default=list(REGULARISATION), metavar="ENTROPY:KL",
                           help="gradients: entropy and KL coefficients of each arm")
            p.add_argument("--grad-buckets", type=int, default=6)
            p.add_argument("--diag-samples", type=int, default=64, help="MI diagnostics' samples (main, noise)")
            p.add_argument("--jobs", type=int, default=1,
                           help="runs at a time, each its own process sharing the cores or one GPU (main, noise, "
                                "gradients; default 1: one after another in this process)")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--steps", type=int, default=0, help="0: the config's (study: gradients 50, recorded 40)")
        # learn and study: the config's validation (128 levels × 8 samples; one sample per level
        # has a standard error of ~0.04, docs/tuning.md), study every 50 / 20 steps
        p.add_argument("--val-every", type=int, default=None)
        p.add_argument("--eval-episodes", type=int, default=None)
        p.add_argument("--eval-samples", type=int, default=None,
                       help="samples per validation level (success is over all of them; pass@k too)")
        p.add_argument("--set", action="append", default=[],
                       metavar="KEY=VALUE", help="any other config override, e.g. rollout.num_groups=2")
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
    if args.command == "study":
        if args.jobs < 1:
            parser.error(f"--jobs={args.jobs} must be >= 1")
        if args.jobs > 1 and args.part in ("recorded", "reward_noise"):
            parser.error(f"--jobs applies to the parts main, noise, gradients and all; {args.part} runs one at a time")
        for text in args.reward_noise:
            try:
                if not 0 <= float(text) <= 1:
                    raise ValueError
            except ValueError:
                parser.error(f"--reward-noise {text!r}: expected a chance in [0, 1], e.g. 0.2")
        for text in args.rates:
            try:
                if not 0 <= Fraction(text) <= 1:
                    raise ValueError
            except (ValueError, ZeroDivisionError):
                parser.error(f"--rates {text!r}: expected a success rate in [0, 1], e.g. 0.9 or 1/3")
        for text in args.reg:
            try:
                if len(text.split(":")) != 2 or min(float(v) for v in text.split(":")) < 0:
                    raise ValueError
            except ValueError:
                parser.error(f"--reg {text!r}: expected ENTROPY:KL coefficients >= 0, e.g. 0.001:0.01")
    if hasattr(args, "set"):
        args.set = set_overrides(args.set, parser.error)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command in ("learn", "study"):
        compile_cache.enable()  # every seed and arm compiles the same programs (jax's backend not started yet)
    {"learn": learn, "study": study, "ceiling": ceiling, "report": report}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(quiet.run_program(main))  # its runs never import PyTorch
