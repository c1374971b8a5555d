"""Running `learn` and the study's parts: each run an ordinary `train` run, resumable.

A run lives in `<out>/<env>/<arm>/seed<k>` (learn's: `<out>/<env>/seed<k>`) with its
metrics.jsonl and a checkpoint every 10 steps, so a stopped study resumes where it stopped:
finished runs are skipped, interrupted ones resume from their last checkpoint. Before an env's
first run the initial policy is validated once (`start_validation.json`: every arm and seed
starts from it). After every arm `<out>/report.md` is rewritten from the finished runs. With
`jobs` > 1 the runs go to `study_jobs`, each its own process. jax starts inside the functions,
after `host_devices.split_host` has shared out the host's cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ragen_jax.analysis import study_arms as arms
from ragen_jax.analysis.run_configs import run_config
from ragen_jax.analysis.run_records import finished, write_whole
from ragen_jax.analysis.study_arms import Learn, Study
from ragen_jax.analysis.study_jobs import study_in_parallel
from ragen_jax.analysis.study_report import write_report
from ragen_jax.core import host_devices


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

    from ragen_jax.core import distributed
    from ragen_jax.diagnostics import reasoning_check
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.validation import Validator

    exp = make_experiment(config)
    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, exp.run.settings.eval,
                          exp.run.step.rollout, exp.mesh)
    metrics, traj = validator(nnx.state(exp.model))
    metrics.update(reasoning_check.validation_metrics(distributed.to_host(traj), exp.tokenizer, exp.env,
                                                      exp.env_params))
    return metrics


def train_one(config, workdir: Path, steps: int) -> None:
    """Train `config` in `workdir` unless it already logged step `steps` (a started run resumes)."""
    from ragen_jax.run.loop import train

    if finished(workdir, steps):
        print(f"{workdir}: already finished", file=sys.stderr)
        return
    workdir.mkdir(parents=True, exist_ok=True)
    code = train(config, workdir)
    if code not in (0, None):
        raise SystemExit(f"{workdir}: training exited with code {code}")


def learn(options: Learn) -> None:
    """The default config per seed; the config's validation (or the flags') before and during."""
    for seed in options.seeds:
        workdir = options.out / options.env / f"seed{seed}"
        overrides = {**arms.validation_overrides(options),
                     **({"train.steps": str(options.steps)} if options.steps else {}), **options.overrides}
        config = run_config(options.env, seed, overrides)
        host_devices.split_host(config)  # as `python -m ragen_jax.train` does, before jax starts
        record_start(workdir / "start_validation.json", config)
        train_one(config, workdir, config.train.steps)


def run_arm(study: Study, env: str, arm: str, seeds, overrides: dict[str, str]) -> None:
    """One arm's runs, seed by seed; then the report is rewritten."""
    for seed in seeds:
        config = run_config(env, seed, {**overrides, **study.overrides})
        train_one(config, study.out / env / arm / f"seed{seed}", config.train.steps)
    write_report(study.out)


def main_part(study: Study) -> None:
    """Top-p, then no filter, then Top-k matched to Top-p's kept fraction, per env/algorithm;
    first the initial policy's validation (the same levels for every arm and seed)."""
    for env, algo in arms.MAIN:
        if env not in study.envs or algo not in study.algos:
            continue
        base = {**arms.study_overrides(env, study), "algo.name": algo}
        record_start(study.out / env / "start_validation.json", run_config(env, 0, {**base, **study.overrides}))
        for name in [f for f in ("top_p", "none", "top_k") if f in study.filters]:
            overrides = {**base, **arms.FILTERS[name]}
            if name == "top_k":
                groups = run_config(env, 0, {**base, **study.overrides}).rollout.num_groups
                overrides["filter.rho"] = str(arms.matched_k(study.out, env, algo, groups))
            run_arm(study, env, f"{name}-{algo}", study.seeds or arms.SEEDS["main"], overrides)


def noise_part(study: Study) -> None:
    """FrozenLake's slip: Top-p and no filter at each success rate."""
    for arm, overrides in arms.noise_arms(study):
        run_arm(study, "frozenlake", arm, study.seeds or arms.SEEDS["noise"], overrides)


def reward_noise_part(study: Study) -> None:
    """Seed by seed: a first paired seed at every rate before any rate gets a second."""
    env = arms.ENVS["reward_noise"][0]
    record_start(study.out / env / "start_validation.json",
                 run_config(env, 0, {**arms.study_overrides(env, study), **study.overrides}))
    for seed in study.seeds or arms.SEEDS["reward_noise"]:
        for arm, overrides in arms.reward_noise_arms(study):
            run_arm(study, env, arm, [seed], overrides)


def gradients_part(study: Study) -> None:
    """The gradient analysis: each algorithm at each regularisation strength, no filter."""
    for env, arm, overrides in arms.gradient_arms(study):
        run_arm(study, env, arm, study.seeds or arms.SEEDS["gradients"], overrides)


def recorded_part(study: Study) -> None:
    """The 40-step study of docs/results.md ("The recorded study") as it ran: its base settings and
    warm starts, Top-p on the reward std, Top-k keeping a quarter of the groups, fewer optimiser
    steps when fewer groups are kept, the gradient analysis on, validation on 128 levels × 2 every 10 steps."""
    val = arms.recorded_validation(study)
    for env in study.envs:
        record_start(study.out / env / "start_validation.json",
                     run_config(env, 0, {**arms.study_base(env), **val, **study.overrides}))
        for seed in study.seeds or arms.SEEDS["recorded"]:
            for name in study.filters:
                for algo in study.algos:
                    overrides = {**arms.study_base(env), **arms.RECORDED_FILTER, **arms.RECORDED_FILTERS[name],
                                 "algo.name": algo, "train.steps": str(study.steps or 40), "train.save_every": "10",
                                 **val, "grad_buckets": str(study.grad_buckets), "early_stop.val_patience": "0",
                                 "early_stop.empty_batches": "0", "early_stop.reward_std_collapse": "0",
                                 **study.overrides}
                    train_one(run_config(env, seed, overrides), study.out / env / f"{name}-{algo}" / f"seed{seed}",
                              study.steps or 40)


RUN_PART = {"main": main_part, "noise": noise_part, "gradients": gradients_part, "recorded": recorded_part,
            "reward_noise": reward_noise_part}


def run_study(study: Study, script: Path) -> None:
    """The asked part, or main, noise and gradients in turn (`all`); with `jobs` > 1 that many runs
    at a time, each `script` (the study's command) for that run alone."""
    parts = ("main", "noise", "gradients") if study.part == "all" else (study.part,)
    if study.jobs > 1:
        return study_in_parallel(study, parts, script)
    # as `python -m ragen_jax.train` does, before jax starts: one device per core (the study's runs
    # share their env config's rollout batch and minibatch); the recorded study ran on one device
    if parts != ("recorded",):
        host_devices.split_host(run_config((study.envs or arms.ENVS[parts[0]])[0], 0, study.overrides))
    for part in parts:
        RUN_PART[part](study.with_part_envs(part))
