"""A study's runs a few at a time (`--jobs N`), each the study's command for that run alone.

Every unfinished run of the asked parts becomes a `job_pool.Job`, its output in
`<out>/logs/<env>-<arm>-seed<k>.log`, its environment sharing out the host's cores (one jax CPU
device per core of its share) or one GPU's memory. Runs wait only where they must: an env's main
runs for its first run's validation of the initial policy, a seed for the first run of its arm
to have trained a step (its programs are then in the compilation cache), and Top-k for the Top-p
runs it is matched to.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from ragen_jax.analysis import study_arms as arms
from ragen_jax.analysis.job_pool import Job, Stopped, run_jobs
from ragen_jax.analysis.run_configs import run_config
from ragen_jax.analysis.run_records import last_step, run_finished
from ragen_jax.analysis.study_arms import Study
from ragen_jax.analysis.study_report import write_report
from ragen_jax.core import host_devices


def job_flags(study: Study) -> list[str]:
    """The flags every run of a parallel study passes on, beside its own selection."""
    flags = ["--out", str(study.out), "--steps", str(study.steps), "--grad-buckets", str(study.grad_buckets),
             "--diag-samples", str(study.diag_samples)]
    for flag in ("val_every", "eval_episodes", "eval_samples"):
        if getattr(study, flag) is not None:
            flags += [f"--{flag.replace('_', '-')}", str(getattr(study, flag))]
    return flags + [a for key, value in study.overrides.items() for a in ("--set", f"{key}={value}")]


def job_environment(study: Study, env: str) -> dict[str, str]:
    """A run's environment in a parallel study: the host's cores shared out (one jax CPU device per
    core of its share) and, on a GPU, memory taken as needed so the runs fit on one card."""
    environ = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    host_devices.split_host(run_config(env, 0, study.overrides), cores=max(1, (os.cpu_count() or 1) // study.jobs),
                            environ=environ)
    return environ


def study_jobs(study: Study, parts, script: Path) -> list[Job]:
    """Every unfinished run of `parts` as a job: `script study` for that run alone.
    A run waits for the first run of its arm to have trained a step (its programs are then in the
    compilation cache, so it starts without compiling) and, in the main part, for its env's
    initial validation (the env's first run writes it); either stops holding it back once that
    run has ended. Top-k runs wait for the Top-p runs of their env and algorithm, and k is fixed
    before the first of them starts."""
    flags, jobs = job_flags(study), []
    names: dict[Path, str] = {}
    first_of: dict[str, Path] = {}  # an arm ("env/arm") or an env's main part -> its first run

    def after_first(key: str, workdir: Path, done):
        """A `ready` for the runs after the first of `key`: that run is `done` (or ended)."""
        first = first_of.setdefault(key, workdir)
        return lambda ended: first == workdir or done(first) or names[first] in ended

    def add(part, env, arm, seed, selection, after=(), before=lambda: None) -> str | None:
        """Plan the run (its name), unless it is planned already (noise's rate 0.8 is main's) or finished."""
        workdir = study.out / env / arm / f"seed{seed}"
        if workdir in names or run_finished(workdir):
            return None
        names[workdir] = f"{env}/{arm}/seed{seed}"
        compiled = after_first(f"{env}/{arm}", workdir, lambda first: last_step(first) >= 1)
        validated = after_first(f"{env}/main", workdir, lambda _: (study.out / env / "start_validation.json").exists())
        ready = (lambda ended: compiled(ended) and validated(ended)) if part == "main" else compiled
        jobs.append(Job(names[workdir], [sys.executable, str(script), "study", "--part", part, *selection,
                                         "--seeds", str(seed), *flags],
                        study.out / "logs" / f"{env}-{arm}-seed{seed}.log", tuple(after), ready, before,
                        job_environment(study, env)))
        return names[workdir]

    for part in parts:
        for env in study.envs or arms.ENVS[part]:
            if part == "main":
                for algo in [a for e, a in arms.MAIN if e == env and a in study.algos]:
                    base = {**arms.study_overrides(env, study), "algo.name": algo, **study.overrides}
                    top_p = []
                    for name in [f for f in ("top_p", "none", "top_k") if f in study.filters]:
                        for seed in study.seeds or arms.SEEDS["main"]:
                            fix_k = (lambda e=env, a=algo, b=base:
                                     arms.matched_k(study.out, e, a, run_config(e, 0, b).rollout.num_groups))
                            planned = add("main", env, f"{name}-{algo}", seed,
                                          ["--envs", env, "--algos", algo, "--filters", name],
                                          after=top_p if name == "top_k" else (),
                                          before=fix_k if name == "top_k" else (lambda: None))
                            if name == "top_p" and planned:
                                top_p.append(planned)
            elif part == "noise" and env == "frozenlake":  # the sweep is FrozenLake's slip
                for rate in study.rates:
                    for name in [f for f in ("top_p", "none") if f in study.filters]:
                        [(arm, _)] = arms.noise_arms(dataclasses.replace(study, rates=[rate], filters=[name]))
                        for seed in study.seeds or arms.SEEDS["noise"]:
                            add("noise", env, arm, seed, ["--rates", rate, "--filters", name])
            elif part == "gradients":
                for algo in study.algos:
                    for reg in study.reg:
                        [(_, arm, _)] = arms.gradient_arms(
                            dataclasses.replace(study, envs=[env], algos=[algo], reg=[reg]))
                        for seed in study.seeds or arms.SEEDS["gradients"]:
                            add("gradients", env, arm, seed, ["--envs", env, "--algos", algo, "--reg", reg])
    return jobs


def study_in_parallel(study: Study, parts, script: Path) -> None:
    """The runs of `parts` as `study.jobs` processes at a time; the report once they are done."""
    try:
        codes = run_jobs(study_jobs(study, parts, script), study.jobs, say=lambda line: print(line, flush=True))
    except Stopped as stop:
        write_report(study.out)
        print(f"stopped: the runs that were running ({', '.join(stop.jobs) or 'none'}) got SIGTERM and ended, "
              "each after saving a checkpoint; the same command resumes the study", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    write_report(study.out)
    failed = sorted(name for name, code in codes.items() if code != 0)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(codes)} runs did not finish: {', '.join(failed)} "
                         f"(their logs: {study.out / 'logs'})")
