"""The study's arms: which runs each part of the study makes, and the config overrides of each.

Every run is the tiny config of its env (configs/sokoban_tiny.py, 400 steps;
configs/frozenlake_tiny.py, 140 steps) with the paper's filter: variance mass, and the same
optimiser steps per RL step whatever is kept (`filter.update=paper`). The parts:
- main: Top-p 0.9, Top-k matched, no filter × GRPO on both envs and PPO on Sokoban, seeds 0–4.
  Top-k is matched by construction: k = the mean kept fraction of the finished Top-p runs of the
  same env and algorithm × the groups (fixed in `<arm>/matched.json` when its first run starts,
  `matched_k`), so Top-k runs after Top-p. Validation on the config's fixed levels (128 × 8
  samples) every 50 (Sokoban) / 20 (FrozenLake) steps, MI diagnostics with 64 samples every 10
  steps, so both meet at every validation.
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

`Learn` and `Study` are what `benchmarks/reproduce.py learn` and `study` ask for, flag by flag.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ragen_jax.analysis import study as st
from ragen_jax.analysis.run_configs import run_config
from ragen_jax.analysis.run_records import finished_runs, write_whole

ALGOS = ("ppo", "grpo")
PARTS = ("main", "noise", "gradients", "recorded", "reward_noise")
# Each part's envs when the command names none.
ENVS = {"main": ["sokoban", "frozenlake"], "noise": ["frozenlake"], "gradients": ["sokoban"],
        "recorded": ["sokoban", "frozenlake"], "reward_noise": ["frozenlake_paper"]}
# main: the (env, algorithm) pairs the study runs (GRPO on both envs, PPO on Sokoban)
MAIN = (("sokoban", "grpo"), ("sokoban", "ppo"), ("frozenlake", "grpo"))
# The arms' filters; Top-k's k is matched to Top-p's kept fraction when it runs (`matched_k`).
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


@dataclass(kw_only=True)
class Runs:
    """What every run of `learn` and the study shares: where runs go (`out`), their length (0:
    the config's), how often and on how many levels × samples they validate (None: the config's,
    or the study's), and any other config overrides."""

    out: Path
    steps: int = 0
    val_every: int | None = None
    eval_episodes: int | None = None
    eval_samples: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)

    def error(self) -> str | None:
        """The first bad value, as one line naming its flag; None when all are good."""
        for flag in ("eval_episodes", "eval_samples"):
            value = getattr(self, flag)
            if value is not None and value < 1:
                return f"--{flag.replace('_', '-')}={value} must be >= 1"
        return None


@dataclass(kw_only=True)
class Learn(Runs):
    """`learn`: the default config of `env`, one run per seed."""

    env: str
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])


@dataclass(kw_only=True)
class Study(Runs):
    """`study`: a part (or `all`: main, noise and gradients in turn) and the selection of its
    arms; None for `envs` or `seeds` is the part's own (`ENVS`, `SEEDS`). `jobs`: runs at a time."""

    part: str = "all"
    envs: list[str] | None = None
    seeds: list[int] | None = None
    filters: list[str] = field(default_factory=lambda: ["top_p", "none", "top_k"])
    algos: list[str] = field(default_factory=lambda: list(ALGOS))
    rates: list[str] = field(default_factory=lambda: list(NOISE_RATES))
    reward_noise: list[str] = field(default_factory=lambda: list(REWARD_NOISE))
    reg: list[str] = field(default_factory=lambda: list(REGULARISATION))
    grad_buckets: int = 6
    diag_samples: int = 64
    jobs: int = 1

    def error(self) -> str | None:
        """The first bad value, as one line naming its flag; None when all are good."""
        problem = super().error()
        if problem or self.jobs < 1:
            return problem or f"--jobs={self.jobs} must be >= 1"
        if self.jobs > 1 and self.part in ("recorded", "reward_noise"):
            return f"--jobs applies to the parts main, noise, gradients and all; {self.part} runs one at a time"
        for text in self.reward_noise:
            try:
                if not 0 <= float(text) <= 1:
                    raise ValueError
            except ValueError:
                return f"--reward-noise {text!r}: expected a chance in [0, 1], e.g. 0.2"
        for text in self.rates:
            try:
                if not 0 <= Fraction(text) <= 1:
                    raise ValueError
            except (ValueError, ZeroDivisionError):
                return f"--rates {text!r}: expected a success rate in [0, 1], e.g. 0.9 or 1/3"
        for text in self.reg:
            try:
                if len(text.split(":")) != 2 or min(float(v) for v in text.split(":")) < 0:
                    raise ValueError
            except ValueError:
                return f"--reg {text!r}: expected ENTROPY:KL coefficients >= 0, e.g. 0.001:0.01"
        return None

    def with_part_envs(self, part: str) -> Study:
        """This study with `part`'s envs where it names none."""
        return dataclasses.replace(self, envs=self.envs or ENVS[part])


def study_base(env: str) -> dict[str, str]:
    """The recorded study's base settings (its tiny defaults and warm start)."""
    return {**STUDY_BASE, "model.init": STUDY_WARM_START[env]}


def validation_overrides(runs: Runs) -> dict[str, str]:
    """How often and on how many levels × samples per level a run validates; a flag left unset
    (`learn`'s defaults) keeps the config's own value."""
    flags = {"train.val_every": runs.val_every, "eval.num_envs": runs.eval_episodes,
             "eval.samples_per_env": runs.eval_samples}
    return {key: str(value) for key, value in flags.items() if value is not None}


def study_overrides(env: str, study: Study) -> dict[str, str]:
    """What every run of the study's main and noise parts gets, before its arm's own keys."""
    return {**STUDY_RUN, "diagnostics.num_samples": str(study.diag_samples),
            "train.val_every": str(VAL_EVERY[env]), **validation_overrides(study),
            **({"train.steps": str(study.steps)} if study.steps else {})}


def rates(texts) -> list[float]:
    """`--rates` items (decimals or fractions like 1/3) as floats."""
    return [float(Fraction(t)) for t in texts]


def regularisation(texts) -> list[tuple[str, str]]:
    """`--reg ENTROPY:KL` items as (entropy coefficient, KL coefficient) strings."""
    return [tuple(t.split(":", 1)) for t in texts]


def config_success_rate() -> float:
    """The noise env's own `env.success_rate`: its arms are main's (no `-success` suffix)."""
    return run_config(ENVS["noise"][0], 0, {}).env.success_rate


def noise_arms(study: Study) -> list[tuple[str, dict[str, str]]]:
    """(arm, overrides) of the stochasticity sweep: FrozenLake, GRPO, Top-p and no filter at each
    `env.success_rate`; the config's own rate is main's arm (the same runs)."""
    default = config_success_rate()
    arms = []
    for rate in rates(study.rates):
        for name in [f for f in ("top_p", "none") if f in study.filters]:
            suffix = "" if rate == default else f"-success{rate:.3g}"
            arms.append((f"{name}-grpo{suffix}", {**study_overrides("frozenlake", study), "algo.name": "grpo",
                                                   **FILTERS[name], "env.success_rate": repr(rate)}))
    return arms


def reward_noise_arms(study: Study) -> list[tuple[str, dict[str, str]]]:
    """(arm, overrides) of the paper's stochasticity axis: GRPO, Top-p and no filter at each
    `env.reward_noise` on the paper's lake."""
    env = ENVS["reward_noise"][0]
    return [(f"{name}-grpo-rnoise{q}", {**study_overrides(env, study), "algo.name": "grpo", **FILTERS[name],
                                          "env.reward_noise": q})
            for q in study.reward_noise for name in ("top_p", "none") if name in study.filters]


def gradient_arms(study: Study) -> list[tuple[str, str, dict[str, str]]]:
    """(env, arm, overrides) of the gradient analysis: no filter (every group trains, as measured),
    each algorithm at each regularisation strength, no MI diagnostics or validation (the
    analysis runs at step 1 and every 5 steps without them)."""
    arms = []
    for env in study.envs:
        for algo in study.algos:
            for entropy, kl in regularisation(study.reg):
                arms.append((env, f"none-{algo}-ent{entropy}-kl{kl}", {
                    **STUDY_RUN, **FILTERS["none"], "algo.name": algo, "algo.entropy_coef": entropy,
                    "algo.kl_coef": kl, "grad_buckets": str(study.grad_buckets), "diagnostics.enabled": "false",
                    "diagnostics.compute_freq": "5",  # the analysis's schedule
                    "train.val_every": "0", "train.steps": str(study.steps or GRADIENT_STEPS)}))
    return arms


def recorded_validation(study: Study) -> dict[str, str]:
    """How the recorded study's runs validate: on 128 levels × 2 samples every 10 steps, unless
    the flags say otherwise."""
    return {"train.val_every": str(study.val_every or 10), "eval.num_envs": str(study.eval_episodes or 128),
            "eval.samples_per_env": str(study.eval_samples or 2)}


def matched_k(out: Path, env: str, algo: str, num_groups: int) -> int:
    """Top-k's group count for env/algo: fixed in `top_k-<algo>/matched.json` when first asked,
    from the finished Top-p runs of the same env and algorithm then (so every Top-k seed keeps
    the same k, and a resumed Top-k run finds the config it started with)."""
    path = out / env / f"top_k-{algo}" / "matched.json"
    if path.exists():
        return json.loads(path.read_text())["k"]
    top_p = finished_runs(out / env / f"top_p-{algo}")
    if not top_p:
        raise SystemExit(f"Top-k on {env}/{algo} is matched to finished Top-p runs, and there are none under "
                         f"{out / env / f'top_p-{algo}'}: run --filters top_p first (the default order does)")
    kept = [st.summarise_run(r)["mean_kept_ratio"] for r in top_p]
    k = st.matched_top_k(kept, num_groups)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps({"k": k, "groups": num_groups, "top_p_runs": len(top_p),
                                  "top_p_mean_kept_fraction": sum(kept) / len(kept)}, indent=2))
    return k
