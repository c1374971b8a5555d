"""Run configuration: the ConfigDict of config files and overrides, and its one conversion into
the typed `RunConfig` the code takes.

Every key, its default and its checks live in the frozen dataclasses of `ragen_jax.run.schema`;
`default_config()` generates the ml_collections ConfigDict from them. A config file in configs/
defines `get_config()`, which starts from `default_config()` (the defaults of docs/method.md)
and changes what it needs. The command line overrides any key with `--config.section.key=value`,
parsed as the type of the key's dataclass field (`None` where the field may be unset). `build`
turns the ConfigDict into a `RunConfig` once; mistakes end in one `ConfigError` line naming the
key, the value and what is allowed, before anything heavy starts.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict as config_dict_lib

from ragen_jax.envs import registry
from ragen_jax.models.config import DecoderConfig, LoraConfig
from ragen_jax.rl.filtering import METRIC_ALIASES
from ragen_jax.core.errors import ConfigError  # noqa: F401  (raised here; config_lib.ConfigError)
from ragen_jax.run.schema import Settings
from ragen_jax.core.sharding import rows_indivisible
from ragen_jax.training.step import StepConfig

# Keys that may change between a run and its resumption (they do not change the numbers).
RESUMABLE_KEYS = ("train.steps", "train.resume", "train.log_every", "train.save_every", "train.keep_checkpoints",
                  "train.validate_at_start", "train.skip_damaged", "logging.tensorboard", "logging.wandb",
                  "logging.wandb_project", "logging.progress",
                  "algo.micro_batch_memory_gib")  # only read to resolve an "auto" micro-batch, whose number is saved
NONE_WORDS = ("None", "none", "null")  # how the command line unsets an optional key


def _field_types(cls) -> dict[str, Any]:
    """Each field's annotation, evaluated (`"int | None"` -> `int | None`)."""
    return typing.get_type_hints(cls)


def _value_types(annotation) -> list[type]:
    """The types a field holds when set: `int | None` -> [int]; `int | str` -> [int, str]."""
    return [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]


def _value_type(annotation) -> type:
    """The type a field holds when set: `int | None` -> int; `float` -> float."""
    return _value_types(annotation)[0]


def _is_optional(annotation) -> bool:
    return type(None) in typing.get_args(annotation)


def _field_default(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def config_dict(cls=Settings) -> ml_collections.ConfigDict:
    """The ConfigDict of a settings dataclass: a section per nested dataclass, each key its
    field's default; an optional key left unset is a typed placeholder (None until set)."""
    c = ml_collections.ConfigDict()
    types_ = _field_types(cls)
    for field in dataclasses.fields(cls):
        kind = types_[field.name]
        if dataclasses.is_dataclass(kind):
            c[field.name] = config_dict(kind)
            continue
        default = _field_default(field)
        if len(_value_types(kind)) > 1:  # `int | str`: a value of either type (the section checks it)
            c[field.name] = config_dict_lib.FieldReference(default, field_type=object)
        else:
            c[field.name] = config_dict_lib.placeholder(_value_type(kind)) if default is None else default
    return c


def default_config() -> ml_collections.ConfigDict:
    return config_dict(Settings)


def tiny_cpu_config(env_name: str, warm_start: str | None = None) -> ml_collections.ConfigDict:
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
    c.model.update(preset=None, path=None, dtype="bfloat16", remat=True, scan_layers=True, vocab_chunk=16384)
    c.diagnostics.score_rows = 16
    c.rollout.update(num_groups=8, group_size=16, max_turns=5, max_new_tokens=120)
    c.algo.update(name="ppo", mini_batch_size=32, micro_batch_size=8)
    c.mesh.update(data=1 if fsdp else -1, fsdp=-1 if fsdp else 1, tensor=1)
    c.train.update(steps=400, save_every=25, val_every=10)
    c.eval.update(num_envs=64)
    return c


def one_chip_config(env_name: str) -> ml_collections.ConfigDict:
    """The paper's setting as the TPU compiler fits it on one 16 GiB chip (Colab's TPU v5e-1)
    with Qwen2.5-0.5B, every weight trained in float32 (docs/scaling.md): GRPO, so no critic. The
    paper's own PPO with float32 weights and moments needs more than 18.8 GiB there
    (`configs/sokoban_qwen2p5_0p5b_ppo_v5e1.py` fits it with bfloat16 moments)."""
    c = paper_config(env_name, fsdp=False)
    c.algo.name = "grpo"
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


def _parse(name: str, text: str, annotation) -> Any:
    """`text` from `--config.{name}=text` as a value of the field's type `annotation`."""
    kind, optional = _value_type(annotation), _is_optional(annotation)
    if optional and text in NONE_WORDS:
        return None
    if str in _value_types(annotation) and kind is not str:  # `int | str`: a number, else the text
        try:
            return _parse(name, text, kind)
        except ConfigError:
            return text
    unset = " or None (unset)" if optional else ""
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{name}={text!r}: expected true or false{unset}")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{name}={text!r}: expected an integer{unset}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{name}={text!r}: expected a number{unset}") from None
    return text


def field_annotation(name: str):
    """The type of the settings field `name` ("algo.dual_clip" -> `float | None`)."""
    cls, parts = Settings, name.split(".")
    for part in parts[:-1]:
        cls = _field_types(cls)[part]
    return _field_types(cls)[parts[-1]]


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
            node[parts[-1]] = _parse(name, text, field_annotation(name))
    return config


# ----------------------------------------------------------------------------- building


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run's validated config: the file's sections (`settings`), the train step's static
    config and the mesh on the devices present, and the config's values as a plain dict (what
    the workdir's config.json holds)."""

    settings: Settings
    step: StepConfig
    mesh_shape: tuple[int, int, int]
    values: dict

    @property
    def env_name(self) -> str:
        return self.settings.env.name

    @property
    def env_overrides(self) -> dict:
        return self.settings.env.arguments()


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


def settings_from_dict(values: dict, cls=Settings, prefix: str = ""):
    """The dataclass `cls` of a config's values, section by section; a key the values lack (a
    saved config that predates it) gets its default."""
    types_ = _field_types(cls)
    for key in values:
        if key not in types_:
            raise ConfigError(f"unknown config key {prefix + key!r}; allowed here: {', '.join(sorted(types_))}")
    fields = {}
    for key, value in values.items():
        if dataclasses.is_dataclass(types_[key]):
            section = prefix + key
            value = _wrap(section, lambda: settings_from_dict(value, types_[key], section + "."))
        fields[key] = value
    return cls(**fields)


def build(config: ml_collections.ConfigDict | dict, device_count: int) -> RunConfig:
    """Validate the whole config and build the static configs (no arrays, no compiles)."""
    values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else copy.deepcopy(config)
    settings = settings_from_dict(values)
    _wrap("env", lambda: registry.make(settings.env.name, **settings.env.arguments()))
    step = _wrap("", lambda: StepConfig(
        rollout=settings.rollout.rollout_config(), filter=settings.filter, algo=settings.algo,
        diagnostics=settings.diagnostics.diagnostics_config(), grad_buckets=settings.grad_buckets,
        grad_every=settings.diagnostics.compute_freq if settings.grad_buckets else 0,
        total_steps=settings.train.steps, reward_noise=settings.env.reward_noise))
    if settings.algo.weight_rounding == "stochastic" and settings.model.param_dtype != "bfloat16":
        raise ConfigError(f"algo.weight_rounding='stochastic' rounds bfloat16 weights, and model.param_dtype is "
                          f"{settings.model.param_dtype!r}: set model.param_dtype=bfloat16, or leave the rounding "
                          "'nearest'")
    data, fsdp, tensor = _wrap("mesh", lambda: settings.mesh.shape(device_count))
    problem = rows_indivisible(step.rollout.batch, step.algo.mini_batch_size, data * fsdp)
    if problem:
        raise ConfigError(problem)
    return RunConfig(settings=settings, step=step, mesh_shape=(data, fsdp, tensor), values=values)


def with_micro_batch(run: RunConfig, micro_batch_size: int) -> RunConfig:
    """`run` with `algo.micro_batch_size` set to a number (an "auto" one resolved), in its
    settings, its step config and the values config.json records."""
    algo = dataclasses.replace(run.settings.algo, micro_batch_size=micro_batch_size)
    values = copy.deepcopy(run.values)
    values["algo"]["micro_batch_size"] = micro_batch_size
    return dataclasses.replace(run, settings=dataclasses.replace(run.settings, algo=algo),
                               step=dataclasses.replace(run.step, algo=algo), values=values)


def model_options(config: ml_collections.ConfigDict) -> dict:
    """The `DecoderConfig` fields the `model` section sets (a saved config that predates a key
    gets its default)."""
    defaults = DecoderConfig.numeric_defaults()
    options = {key: config.model.get(key, default) for key, default in defaults.items()}
    lora = options["lora"]
    if not isinstance(lora, LoraConfig):  # a section's values: a ConfigDict or dict
        options["lora"] = LoraConfig(**{**dataclasses.asdict(LoraConfig()), **dict(lora)})
    return options


def to_json(config: ml_collections.ConfigDict | dict) -> str:
    values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    return json.dumps(values, indent=2, sort_keys=True)


# Keys added after runs were saved whose default is not what those runs did: a saved config
# without the key ran this value.
BEFORE_THE_KEY = {"filter": {"update": "fewer_steps"}}
# The values that meant "unset" in configs saved before unset keys were None.
UNSET_BEFORE_NONE = {"env": {"max_steps": (0,), "success_rate": (-1,), "data_path": ("",), "data_dir": ("",)},
                     "model": {"preset": ("",), "path": ("",), "init": ("",)},
                     "rollout": {"action_temperature": (-1,), "action_top_k": (0,)},
                     "algo": {"advantage": ("", "preset"), "aggregation": ("", "preset"), "dual_clip": (0,)}}


def read_saved(saved: dict) -> dict:
    """A saved run config in today's terms: keys added since it was saved get what the run did
    (`BEFORE_THE_KEY`), values that meant "unset" are None (`UNSET_BEFORE_NONE`) and renamed
    values have their current name (`filter.metric='reward_variance'` is `reward_std`)."""
    saved = copy.deepcopy(saved)
    for section, keys in BEFORE_THE_KEY.items():
        if isinstance(saved.get(section), dict):
            for key, value in keys.items():
                saved[section].setdefault(key, value)
    for section, keys in UNSET_BEFORE_NONE.items():
        if isinstance(saved.get(section), dict):
            for key, unset in keys.items():
                value = saved[section].get(key)
                if not isinstance(value, bool) and value in unset:
                    saved[section][key] = None
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
