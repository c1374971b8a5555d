"""Run configuration: every key with its default in one place, overrides, validation.

A config file in configs/ defines `get_config()`, which starts from `default_config()` (the
defaults of docs/method.md) and changes what it needs. The command line overrides any key with
`--config.section.key=value`; the value is parsed as the type of the key's default. Mistakes
end in one `ConfigError` line naming the key, the value and what is allowed, before anything
heavy starts (`build` turns the ConfigDict into the frozen dataclasses the code uses, and
those validate their own ranges).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import json
import math
import os
from typing import Any

import ml_collections

from ragen_jax.diagnostics.diagnose import DiagnosticsConfig
from ragen_jax.envs import registry
from ragen_jax.models import sampling
from ragen_jax.models.qwen2 import PRESETS, REMAT_POLICIES
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import METRIC_ALIASES, FilterConfig
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.run.errors import ConfigError  # noqa: F401  (raised here; config_lib.ConfigError)
from ragen_jax.run.sharding import rows_indivisible
from ragen_jax.training.step import StepConfig

PRESET = ""  # algo.advantage / algo.aggregation: "" means "the algorithm preset's"
# Keys that may change between a run and its resumption (they do not change the numbers).
RESUMABLE_KEYS = ("train.steps", "train.resume", "train.log_every", "train.save_every", "train.keep_checkpoints",
                  "train.skip_damaged", "logging.tensorboard", "logging.wandb", "logging.wandb_project",
                  "logging.progress")


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.env = ml_collections.ConfigDict(dict(
        name="SimpleSokoban", max_steps=0,  # 0: the preset's
        # MathQA only: records from a local file (JSON lines / JSON / parquet), else `num_records`
        # generated arithmetic problems from `data_seed`; prepared by tensorflow-datasets under
        # `data_dir` ("" : its default); a question allows `max_attempts` valid answers.
        data_path="", data_dir="", num_records=1000, data_seed=0, max_attempts=1,
        # FrozenLake only: the chance a move goes where it was meant to (gymnasium's slip; 1.0 is
        # deterministic); -1: the preset's 1/3, the classic slippery lake.
        success_rate=-1.0,
    ))
    c.model = ml_collections.ConfigDict(dict(
        preset="tiny",  # built-in shapes, random init (or `init` weights); ignored when `path` is set
        path="",  # a local Hugging Face checkpoint directory (config.json + safetensors)
        init="",  # initial weights: a train/sft workdir, a Hugging Face dir, or builtin:<name> (shipped)
        dtype="float32", param_dtype="float32",
        # rematerialise each layer in the backward pass, keeping what `remat_policy` names
        # (full | minimal | dots: ragen_jax.models.qwen2.REMAT_POLICIES)
        remat=False, remat_policy="full",
        # one layer's program scanned over stacked weights (compile time independent of depth)
        # instead of a Python loop over the layers (on a CPU the tiny model runs faster unrolled)
        scan_layers=False,
        # log-probs over the vocabulary this many entries at a time (0: all at once); at a 152K
        # vocabulary the f32 logits are most of the loss's and the diagnostics' memory
        vocab_chunk=0,
    ))
    c.rollout = ml_collections.ConfigDict(dict(
        num_groups=8, group_size=16, max_turns=5, max_actions_per_turn=2, max_actions_per_traj=10,
        max_new_tokens=120, format_penalty=-0.1, temperature=1.0, top_p=1.0, top_k=0,
        # each action's first token in the answer (a move's name): its temperature (-1: `temperature`)
        # and top-k (0: `top_k`; e.g. the number of moves, so a hot draw stays a move)
        action_temperature=-1.0, action_top_k=0,
        shared_env_noise=False,  # a group's members meet the same env noise (slips), see RolloutConfig
    ))
    c.filter = ml_collections.ConfigDict(dict(
        # metric: reward_var (the paper's variance mass, sample variance with `ddof`), reward_std
        # (RAGEN's code; `reward_variance` is accepted as another name), reward_mean, entropy.
        # update: paper (the same optimiser steps per RL step as an unfiltered batch, each on
        # kept rows / steps rows) or fewer_steps (full minibatches, ceil(kept rows / minibatch) steps).
        metric="reward_var", ddof=1, strategy="top_p", rho=0.9, prob_mode="linear", include_zero=True,
        loss_scaling="none", bootstrap_fraction=0.0, update="paper",
    ))
    c.algo = ml_collections.ConfigDict(dict(
        name="ppo", advantage=PRESET, aggregation=PRESET, clip_low=0.2, clip_high=0.28, dual_clip=0.0,
        entropy_coef=0.001, kl_coef=0.0, kl_estimator="k3", gamma=1.0, lam=1.0, actor_lr=1e-6, critic_lr=1e-5,
        weight_decay=0.01, grad_clip=1.0, lr_warmup=0, adam_eps=1e-8, lr_decay_fraction=0.0, value_clip=0.5,
        adam_moments="param",  # or "bfloat16": Adam's moments stored in bfloat16 (half the optimiser memory)
        mini_batch_size=32, micro_batch_size=0, epochs=1,
    ))
    c.diagnostics = ml_collections.ConfigDict(dict(
        enabled=True, compute_freq=5, num_samples=64, per_turn=True, per_turn_samples=16, action_grounding=True,
        answer_tokens=32, alarm_drop=0.5, alarm_entropy_tolerance=0.1, alarm_below=0.0, prefill_rows=8,
        score_rows=0,  # samples scored at a time (0: all at once; a bound on memory at real sizes)
        stop_on_alarm=False,
    ))
    c.grad_buckets = 0  # reward-std buckets of the gradient analysis (0: off; the paper uses 6)
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # -1: all remaining devices
    c.train = ml_collections.ConfigDict(dict(
        steps=200, log_every=1, save_every=20, keep_checkpoints=3, val_every=10, resume=True,
        skip_damaged=True,  # resume from the newest checkpoint that restores (false: stop at a damaged one)
    ))
    c.eval = ml_collections.ConfigDict(dict(num_envs=32, samples_per_env=1, temperature=0.5, seed=1234))
    c.early_stop = ml_collections.ConfigDict(dict(
        empty_batches=5,  # stop after this many filtered-empty steps in a row (0: never)
        reward_std_collapse=5,  # ... after this many steps with zero in-group reward std everywhere (0: never)
        val_success_below=0.01, val_patience=5,  # ... when validation success < this for this many validations
    ))
    c.logging = ml_collections.ConfigDict(dict(tensorboard=True, wandb=False, wandb_project="ragen_jax",
                                              progress=True))
    return c


def tiny_cpu_config(env_name: str, warm_start: str = "") -> ml_collections.ConfigDict:
    """The built-in tiny model on `env_name`, sized for a laptop CPU and set to learn from the
    shipped warm starts within ~20 minutes (docs/tuning.md, "What the defaults do and why"): GRPO (no critic to
    fit first) without an entropy bonus, 32 groups × 4, rollouts at the validation temperature
    0.5, a format penalty of −1.0 (at −0.1 a broken answer costs less than a useless move, and
    group-relative advantages slowly reward breaking the format), one Adam step per 64 rows
    (in micro-batches of 8, ≈ 2 s a step), 300 steps; 3 turns of up to 48 tokens; Top-p 0.9 on
    reward std and MI diagnostics every 10 steps; validation on 128 levels × 8 samples every 50
    steps (one sample per level has a standard error of ≈ 0.04). `warm_start`: initial weights
    (`model.init`), e.g. a shipped `builtin:<name>`.

    The filter ranks by the reward std with full minibatches and fewer optimiser steps
    (`filter.metric=reward_std`, `filter.update=fewer_steps`), the settings docs/tuning.md
    measured these configs with; the defaults are the paper's (variance mass, the same number of
    optimiser steps whatever is kept), which benchmarks/reproduce.py's study compares
    (docs/method.md#where-this-project-departs-from-the-paper)."""
    c = default_config()
    c.env.name = env_name
    c.model.update(preset="tiny", init=warm_start)
    c.rollout.update(num_groups=32, group_size=4, max_turns=3, max_actions_per_traj=6, max_new_tokens=48,
                     temperature=0.5, format_penalty=-1.0)
    # micro-batches of 8: a 64-row forward/backward outgrows the CPU's caches, and micro-batches
    # of the filter's padding rows are skipped (docs/benchmarks.md, "Update cost")
    c.algo.update(name="grpo", actor_lr=1e-4, critic_lr=3e-4, mini_batch_size=64, micro_batch_size=8,
                  entropy_coef=0.0)
    c.filter.update(metric="reward_std", update="fewer_steps")
    c.diagnostics.update(compute_freq=10, num_samples=16, per_turn_samples=8, answer_tokens=16)
    c.train.update(steps=300, save_every=25, val_every=50)
    c.eval.update(num_envs=128, samples_per_env=8)
    return c


def paper_config(env_name: str, fsdp: bool) -> ml_collections.ConfigDict:
    """The paper's setting for a local Qwen2.5 checkpoint (`model.path`, required):
    8 groups × 16, 5 turns of up to 120 tokens, PPO (lr 1e-6 / 1e-5), Top-p 0.9, bfloat16
    compute with rematerialisation of each scanned layer, log-probs over the vocabulary in
    chunks, diagnostics scored 16 samples at a time, micro-batches of 8 rows. `fsdp`: shard the
    model over all devices (3B and up) instead of replicating it (data parallelism)."""
    c = default_config()
    c.env.name = env_name
    c.model.update(preset="", path="", dtype="bfloat16", remat=True, scan_layers=True, vocab_chunk=16384)
    c.diagnostics.score_rows = 16
    c.rollout.update(num_groups=8, group_size=16, max_turns=5, max_new_tokens=120)
    c.algo.update(name="ppo", mini_batch_size=32, micro_batch_size=8)
    c.mesh.update(data=1 if fsdp else -1, fsdp=-1 if fsdp else 1, tensor=1)
    c.train.update(steps=400, save_every=25, val_every=10)
    c.eval.update(num_envs=64)
    return c


# ----------------------------------------------------------------------------- loading


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """Run a config file's `get_config()`."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location("_ragen_config", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a broken config file is still a user error: one line
        raise ConfigError(f"config file {path!r} failed to load: {type(err).__name__}: {err}") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config() function")
    config = module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path!r}: get_config() must return an ml_collections.ConfigDict")
    check_keys(config, default_config())
    return config


def check_keys(config, reference, prefix="") -> None:
    """Every key of `config` must exist in the defaults (catches typos in config files)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if key not in reference:
            raise ConfigError(f"unknown config key {name!r}; allowed here: {', '.join(sorted(reference.keys()))}")
        if isinstance(value, ml_collections.ConfigDict):
            check_keys(value, reference[key], name + ".")


def _parse(name: str, text: str, default: Any):
    if isinstance(default, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{name}={text!r}: expected true or false")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{name}={text!r}: expected an integer") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{name}={text!r}: expected a number") from None
    if isinstance(default, (tuple, list)):
        try:
            return tuple(ast.literal_eval(text))
        except (ValueError, SyntaxError, TypeError):
            raise ConfigError(f"--config.{name}={text!r}: expected a tuple like (1, 2)") from None
    return text


def split_overrides(items: list[str], error) -> dict[str, str]:
    """`--config.a.b=value` command-line items -> {"a.b": "value"}; anything else goes to
    `error` (an argparse parser's `error`: one line, exit 2)."""
    overrides = {}
    for item in items:
        if not item.startswith("--config.") or "=" not in item:
            error(f"unrecognised argument {item!r} (overrides look like --config.algo.name=grpo)")
        key, value = item[len("--config."):].split("=", 1)
        overrides[key] = value
    return overrides


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> ml_collections.ConfigDict:
    """A copy of `config` with `{"algo.name": "grpo", ...}` (strings from the command line)
    applied; `config` itself is left as it was, so one loaded config can seed several runs."""
    config = copy.deepcopy(config)
    for name, text in overrides.items():
        node, parts = config, name.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                where = ".".join(parts[:i]) or "the top level"
                allowed = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "none"
                raise ConfigError(f"unknown config key {name!r} (no {part!r} in {where}; allowed: {allowed})")
            if i < len(parts) - 1:
                node = node[part]
        if isinstance(node[parts[-1]], ml_collections.ConfigDict):
            raise ConfigError(f"--config.{name} is a section; set one of its keys: "
                              f"{', '.join(sorted(node[parts[-1]].keys()))}")
        with node.unlocked():
            node[parts[-1]] = _parse(name, text, node[parts[-1]])
    return config


# ----------------------------------------------------------------------------- building


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The parts of a run the code consumes, validated."""

    step: StepConfig
    env_name: str
    env_overrides: dict
    mesh_shape: tuple[int, int, int]


def _wrap(section: str, build):
    """Turn a ValueError from a dataclass's own validation into a ConfigError."""
    try:
        return build()
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        message = str(err)
        if section and not message.startswith(section):
            message = f"{section}: {message}"
        raise ConfigError(message) from None


QA_KEYS = {"data_path": "data_path", "data_dir": "data_dir", "num_records": "num_records", "data_seed": "seed",
           "max_attempts": "max_attempts"}


def env_arguments(config: ml_collections.ConfigDict) -> dict:
    """The keyword arguments `registry.make` gets for `config.env`; the dataset keys are for
    MathQA only (setting one for another env is an error, not silently ignored)."""
    e, defaults = config.env, default_config().env
    rate = e.get("success_rate", defaults.success_rate)  # configs saved before the key: the default
    slip = {}
    if rate != defaults.success_rate:
        if registry.ALIASES.get(e.name, e.name) != "FrozenLake":
            raise ConfigError(f"env.success_rate={rate} is only used by FrozenLake, not {e.name}")
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"env.success_rate={rate} must be in [0, 1] (or -1 for the preset's 1/3)")
        slip = {"success_rate": float(rate)}
    is_qa = registry.ALIASES.get(e.name, e.name) in registry.FACTORIES
    if is_qa:
        if e.max_steps:
            raise ConfigError(f"env.max_steps={e.max_steps} is not used by {e.name}; use env.max_attempts")
        return {arg: e[key] for key, arg in QA_KEYS.items()}
    for key in QA_KEYS:
        if e.get(key, defaults[key]) != defaults[key]:
            raise ConfigError(f"env.{key}={e[key]!r} is only used by MathQA, not {e.name}")
    return {**({"max_steps": e.max_steps} if e.max_steps else {}), **slip}


def build(config: ml_collections.ConfigDict, device_count: int) -> RunConfig:
    """Validate the whole config and build the static configs (no arrays, no compiles)."""
    if config.env.name not in registry.names():
        raise ConfigError(f"env.name={config.env.name!r} is not a known environment; allowed: "
                          f"{', '.join(registry.names())}")
    env_overrides = env_arguments(config)
    _wrap("env", lambda: registry.make(config.env.name, **env_overrides))
    if not config.model.path and not config.model.preset:
        raise ConfigError("model.path is required by this config: a local Hugging Face checkpoint directory "
                          "(config.json + safetensors), e.g. --config.model.path=/path/to/Qwen2.5-3B-Instruct")
    if not config.model.path and config.model.preset not in PRESETS:
        raise ConfigError(f"model.preset={config.model.preset!r} is not known; allowed: {', '.join(PRESETS)} "
                          "(or set model.path to a Hugging Face checkpoint directory)")
    for key in ("dtype", "param_dtype"):
        if config.model[key] not in ("float32", "bfloat16"):
            raise ConfigError(f"model.{key}={config.model[key]!r} is not supported; allowed: float32, bfloat16")
    if config.model.vocab_chunk < 0:
        raise ConfigError(f"model.vocab_chunk={config.model.vocab_chunk} must be >= 0 (0: the whole vocabulary at once)")
    if config.model.remat_policy not in REMAT_POLICIES:
        raise ConfigError(f"model.remat_policy={config.model.remat_policy!r} is not supported; allowed: "
                          f"{', '.join(REMAT_POLICIES)}")
    r = config.rollout
    params = _wrap("rollout", lambda: sampling.SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                                               top_k=r.top_k))
    if r.action_temperature != -1.0 and not (math.isfinite(r.action_temperature) and r.action_temperature >= 0):
        raise ConfigError(f"rollout.action_temperature={r.action_temperature} must be >= 0 (0: greedy actions) "
                          "or -1 (the rollout temperature)")
    if r.action_top_k < 0:
        raise ConfigError(f"rollout.action_top_k={r.action_top_k} must be >= 0 (0: rollout.top_k)")
    action_params = dataclasses.replace(params, temperature=float(r.action_temperature if r.action_temperature != -1.0
                                                                  else r.temperature),
                                        top_k=r.action_top_k or r.top_k)
    action_params = None if action_params == params else action_params
    rollout = _wrap("rollout", lambda: RolloutConfig(
        num_groups=r.num_groups, group_size=r.group_size, max_turns=r.max_turns,
        max_actions_per_turn=r.max_actions_per_turn, max_actions_per_traj=r.max_actions_per_traj,
        max_new_tokens=r.max_new_tokens, format_penalty=r.format_penalty, sampling=params,
        action_sampling=action_params, shared_env_noise=r.shared_env_noise))
    filt = _wrap("filter", lambda: FilterConfig(**config.filter.to_dict()))
    a = config.algo.to_dict()
    name = a.pop("name")
    for key in ("advantage", "aggregation"):
        if a[key] == PRESET:
            a.pop(key)
    a["dual_clip"] = a["dual_clip"] or None
    algo = _wrap("algo", lambda: AlgoConfig.preset(name, **a))
    d = config.diagnostics.to_dict()
    enabled = d.pop("enabled")
    d.pop("stop_on_alarm")
    diagnostics = _wrap("diagnostics", lambda: DiagnosticsConfig(**d)) if enabled else None
    t = config.train  # before the step config, whose learning-rate schedule reads train.steps
    for key in ("steps", "log_every", "save_every", "keep_checkpoints", "val_every"):
        if t[key] < (0 if key in ("val_every",) else 1):
            raise ConfigError(f"train.{key}={t[key]} must be >= {0 if key == 'val_every' else 1}")
    step = _wrap("", lambda: StepConfig(rollout=rollout, filter=filt, algo=algo, diagnostics=diagnostics,
                                              grad_buckets=config.grad_buckets, total_steps=config.train.steps))

    sizes = {key: config.mesh[key] for key in ("data", "fsdp", "tensor")}
    for key, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.{key}={size} must be >= 1, or -1 (all devices the other axes leave)")
    if list(sizes.values()).count(-1) > 1:
        raise ConfigError(f"mesh {sizes}: at most one axis may be -1")
    fixed = math.prod(s for s in sizes.values() if s > 0)
    sizes = {k: (max(1, device_count // fixed) if s == -1 else s) for k, s in sizes.items()}
    data, fsdp, tensor = sizes["data"], sizes["fsdp"], sizes["tensor"]
    if data * fsdp * tensor > device_count:
        raise ConfigError(f"mesh {data}x{fsdp}x{tensor} needs {data * fsdp * tensor} devices; "
                          f"{device_count} available")
    problem = rows_indivisible(rollout.batch, algo.mini_batch_size, data * fsdp)
    if problem:
        raise ConfigError(problem)
    e = config.eval
    if e.num_envs < 1 or e.samples_per_env < 1 or e.temperature < 0:
        raise ConfigError(f"eval.num_envs={e.num_envs}, eval.samples_per_env={e.samples_per_env} must be >= 1 "
                          f"and eval.temperature={e.temperature} >= 0")
    s = config.early_stop
    if s.empty_batches < 0 or s.reward_std_collapse < 0 or s.val_patience < 0:
        raise ConfigError("early_stop.empty_batches, reward_std_collapse and val_patience must be >= 0 (0: off)")
    return RunConfig(step=step, env_name=config.env.name, env_overrides=env_overrides,
                     mesh_shape=(data, fsdp, tensor))


def model_options(config: ml_collections.ConfigDict) -> dict:
    """The `Qwen2Config` fields the `model` section sets (a saved config that predates a key
    gets its default)."""
    m, defaults = config.model, default_config().model
    keys = ("dtype", "param_dtype", "remat", "remat_policy", "scan_layers", "vocab_chunk")
    return {key: m.get(key, defaults[key]) for key in keys}


def to_json(config: ml_collections.ConfigDict) -> str:
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


# Keys added after runs were saved whose default is not what those runs did: a saved config
# without the key ran this value.
BEFORE_THE_KEY = {"filter": {"update": "fewer_steps"}}


def read_saved(saved: dict) -> dict:
    """A saved run config in today's terms: keys added since it was saved get what the run did
    (`BEFORE_THE_KEY`) and renamed values their current name (`filter.metric='reward_variance'`
    is `reward_std`)."""
    saved = copy.deepcopy(saved)
    for section, keys in BEFORE_THE_KEY.items():
        if isinstance(saved.get(section), dict):
            for key, value in keys.items():
                saved[section].setdefault(key, value)
    metric = saved.get("filter", {}).get("metric") if isinstance(saved.get("filter"), dict) else None
    if metric in METRIC_ALIASES:
        saved["filter"]["metric"] = METRIC_ALIASES[metric]
    return saved


def differences(saved: dict, new: dict, prefix="", defaults: dict | None = None) -> list[str]:
    """Keys whose values differ (ignoring RESUMABLE_KEYS), as 'key: old -> new'. The saved
    config is read in today's terms (`read_saved`); a key it predates otherwise counts as its
    default (a run saved before the key existed)."""
    if defaults is None:
        saved, defaults = read_saved(saved), default_config().to_dict()
    out = []
    for key in sorted(set(saved) | set(new)):
        name = f"{prefix}{key}"
        a, b = saved.get(key, defaults.get(key)), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, name + ".", defaults.get(key) if isinstance(defaults.get(key), dict) else {})
        elif a != b and name not in RESUMABLE_KEYS:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out
