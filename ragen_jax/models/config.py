"""A decoder's configuration: `DecoderConfig` (shapes and numerics), the named presets, and the
tables and checks of the settings a run may choose (architectures, RoPE types, remat policies,
compute dtypes).

The numerics (`NUMERICS`: dtypes, rematerialisation, scanned layers, vocabulary chunks) apply to
a model of any shape; a run's `model` config section takes its keys, defaults and checks from
here (`check_numerics`), so they live in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

ATTENTION_BLOCK = 128  # query slots per attention block on long inputs (see layers.Attention)
PREFILL_BLOCK = 32  # the block `sampling.generate` uses for its prompt (see cache.DecodeContext)
# The Hugging Face classes this decoder reproduces (`DecoderConfig.architecture`).
ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
ROPE_TYPES = ("default", "linear", "yarn", "llama3")
DTYPES = ("float32", "bfloat16")  # compute and parameter dtypes
# What a rematerialised block keeps for its backward pass (a `jax.checkpoint` policy): "full"
# keeps only the block's input and recomputes the rest; "minimal" also keeps the outputs of its
# weight matmuls (projections and MLP, not the attention scores); "dots" keeps every matmul
# output, the attention scores included.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
}
# How attention is computed (`DecoderConfig.attention`): "einsum", our einsums over blocks of
# queries (tuned on CPU; the reference); "xla" and "cudnn", `jax.nn.dot_product_attention` with
# that implementation in one call (cudnn: a fused kernel on NVIDIA GPUs only). Decoding from a
# per-layer cache (the CPU decode path) always uses "einsum".
ATTENTION = ("einsum", "xla", "cudnn")
# How the stacked KV cache (`cache.KVCache`) stores each slot's keys and values
# (`DecoderConfig.kv_layout`): "heads_major", [layers, B, kv_heads, S, head_dim], which a CPU or
# GPU decode step reads in place; "heads_minor", [layers, B, S, kv_heads * head_dim], for a TPU,
# whose tiles pad the minor axis to 128 lanes (a 64-wide head dimension would take twice its
# bytes in every copy of the cache); "auto": heads_minor on a TPU backend, else heads_major.
KV_LAYOUTS = ("auto", "heads_major", "heads_minor")
# The fields that say how a model computes rather than what it is: a run sets them on any shapes.
NUMERICS = ("dtype", "param_dtype", "remat", "remat_policy", "scan_layers", "unroll_inference", "vocab_chunk",
            "attention", "kv_layout", "lora")
# The projections LoRA adapters may go on (`LoraConfig.targets`; "all-linear": every one of them).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA) on the decoder's projections (`models/lora.py`): each chosen
    projection computes x W + b + (alpha / rank) · (x A) B with A [in, rank] drawn like peft's
    (kaiming-uniform: U(±1/sqrt(in))) and B [rank, out] zero, so an adapted model starts as its
    base exactly; training then updates A and B only. `rank` 0 (the default): no adapters, no
    new variables. `targets`: comma-separated projection names (LORA_TARGETS) or "all-linear".
    `dropout` in [0, 1) (peft's lora_dropout): in the update's loss forwards only, each adapter
    reads x through inverted dropout, x W + b + (alpha / rank) · (drop(x) A) B."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "all-linear"

    def __post_init__(self):
        if isinstance(self.targets, (tuple, list)):  # a tuple of names is accepted too
            object.__setattr__(self, "targets", ",".join(self.targets))
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"model.lora.rank={self.rank!r} must be an integer >= 0 (0: no adapters)")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0 and self.alpha < float("inf")):
            raise ValueError(f"model.lora.alpha={self.alpha!r} must be a finite number > 0 "
                             "(the adapters are scaled by alpha / rank)")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"model.lora.dropout={self.dropout!r} must be a number in [0, 1) (the probability "
                             "of zeroing an adapter's input; 0: no dropout)")
        self.target_names()  # checks the names

    def target_names(self) -> tuple[str, ...]:
        """The targeted projections, in LORA_TARGETS order."""
        names = [n.strip() for n in str(self.targets).split(",") if n.strip()]
        if names == ["all-linear"]:
            return LORA_TARGETS
        unknown = [n for n in names if n not in LORA_TARGETS]
        if unknown or not names:
            raise ValueError(f"model.lora.targets={self.targets!r}: unknown target {unknown[0] if unknown else ''!r}; "
                             f"allowed: all-linear, or a comma-separated list of {', '.join(LORA_TARGETS)}")
        return tuple(n for n in LORA_TARGETS if n in names)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank if self.rank else 0.0

    @property
    def has_dropout(self) -> bool:
        """Whether the update's forwards drop adapter inputs: adapters, and dropout > 0."""
        return self.rank > 0 and self.dropout > 0


def check_numerics(values: dict, prefix: str = "") -> None:
    """A ValueError naming `prefix + key` for the first of `values` (NUMERICS keys) that is not
    allowed; a config section passes its own prefix ("model.")."""
    for key in ("dtype", "param_dtype"):
        if key in values and values[key] not in DTYPES:
            raise ValueError(f"{prefix}{key}={values[key]!r} is not supported; allowed: {', '.join(DTYPES)}")
    if isinstance(values.get("lora"), dict):
        LoraConfig(**values["lora"])  # its own checks
    if values.get("vocab_chunk", 0) < 0:
        raise ValueError(f"{prefix}vocab_chunk={values['vocab_chunk']} must be >= 0 "
                         "(0: the whole vocabulary at once)")
    if "attention" in values and values["attention"] not in ATTENTION:
        raise ValueError(f"{prefix}attention={values['attention']!r} is not supported; allowed: {', '.join(ATTENTION)}")
    if "kv_layout" in values and values["kv_layout"] not in KV_LAYOUTS:
        raise ValueError(f"{prefix}kv_layout={values['kv_layout']!r} is not supported; allowed: {', '.join(KV_LAYOUTS)}")
    if "remat_policy" in values and values["remat_policy"] not in REMAT_POLICIES:
        raise ValueError(f"{prefix}remat_policy={values['remat_policy']!r} is not supported; allowed: "
                         f"{', '.join(REMAT_POLICIES)}")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shapes and numerics of a decoder (Qwen2 or Llama). Frozen, so it can be a static jit argument."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    rope_theta: float = 1_000_000.0
    rope_type: str = "default"  # one of ROPE_TYPES
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # the other rope_parameters entries
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "float32"  # compute dtype ("bfloat16" on TPU/GPU)
    param_dtype: str = "float32"
    # rematerialise each block in the backward pass, keeping what `remat_policy` names
    # (full | minimal | dots: REMAT_POLICIES)
    remat: bool = False
    remat_policy: str = "full"
    # One block with weights stacked [num_layers, ...] run by `lax.scan` (compile time
    # independent of depth), or a Python loop over `num_layers` blocks (on a CPU the tiny model
    # runs faster unrolled).
    scan_layers: bool = False
    # With `scan_layers`: the programs that only run the model forward (rollout, diagnostics,
    # validation: `stacking.for_inference`) run an unrolled copy of the layers, sliced from the
    # stacked weights inside the program, while training keeps scanning: a decode step then
    # runs the layers without a loop over them (on a GPU: no dynamic slices per layer, fusion
    # across layers). Ignored without `scan_layers`.
    unroll_inference: bool = False
    # Log-probabilities over the vocabulary this many entries at a time (0: all at once; see
    # `head.token_logprobs`): the f32 logits of a 152K vocabulary are what the loss would hold most of.
    vocab_chunk: int = 0
    attention: str = "einsum"  # one of ATTENTION
    kv_layout: str = "auto"  # one of KV_LAYOUTS
    initializer_range: float = 0.02
    # The Hugging Face class the weights came from (one of ARCHITECTURES), written back on export.
    architecture: str = "Qwen2ForCausalLM"
    # Biases on the q/k/v projections (Qwen2: yes; Llama: none).
    attention_bias: bool = True
    # Low-rank adapters on the projections (rank 0: none; models/lora.py).
    lora: LoraConfig = LoraConfig()

    def __post_init__(self):
        if isinstance(self.lora, dict):  # from a config section's values
            object.__setattr__(self, "lora", LoraConfig(**self.lora))
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type={self.rope_type!r} is not supported; allowed: {', '.join(ROPE_TYPES)}")
        if self.rope_type == "llama3":
            missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor")
                       if dict(self.rope_scaling).get(k) is None]
            if missing:
                raise ValueError(f"rope_type='llama3' needs {', '.join(missing)} in rope_scaling")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={self.architecture!r} is not supported; allowed: {', '.join(ARCHITECTURES)}")
        check_numerics(self.numerics())

    @classmethod
    def preset(cls, name: str, **overrides) -> "DecoderConfig":
        """A named configuration; keyword overrides replace fields (e.g. dtype="bfloat16")."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    @classmethod
    def numeric_defaults(cls) -> dict:
        """The NUMERICS fields' defaults."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name in NUMERICS}

    def base(self) -> "DecoderConfig":
        """This config without adapters (the base model's)."""
        return dataclasses.replace(self, lora=LoraConfig()) if self.lora.rank else self

    def numerics(self) -> dict:
        """This config's NUMERICS fields."""
        return {key: getattr(self, key) for key in NUMERICS}

    def num_params(self) -> int:
        d, h, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = d * h + 2 * d * kv + h * d + (h + 2 * kv if self.attention_bias else 0)
        per_layer = attn + 3 * d * self.intermediate_size + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_layers * per_layer + d + head


_QWEN25 = dict(vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
               bos_token_id=151643, eos_token_ids=(151645, 151643), pad_token_id=151643, scan_layers=True)
PRESETS: dict[str, DecoderConfig] = {
    # Real shapes (weights come from a checkpoint through hf.load_pretrained), layers scanned.
    "qwen2.5-0.5b": DecoderConfig(hidden_size=896, intermediate_size=4864, num_layers=24,
                                num_heads=14, num_kv_heads=2, **_QWEN25),
    "qwen2.5-1.5b": DecoderConfig(hidden_size=1536, intermediate_size=8960, num_layers=28,
                                num_heads=12, num_kv_heads=2, **_QWEN25),
    "qwen2.5-3b": DecoderConfig(hidden_size=2048, intermediate_size=11008, num_layers=36,
                              num_heads=16, num_kv_heads=2, **_QWEN25),
    "qwen2.5-7b": DecoderConfig(**{**_QWEN25, "vocab_size": 152064}, hidden_size=3584,
                              intermediate_size=18944, num_layers=28, num_heads=28,
                              num_kv_heads=4, tie_word_embeddings=False),
    # CPU-sized models over the built-in 1024-token tokenizer (ids: 0 <|endoftext|>,
    # 1 <|im_start|>, 2 <|im_end|>). Head dims of 32/64: XLA's CPU matmuls are several times
    # slower per FLOP at head_dim 16.
    "tiny": DecoderConfig(vocab_size=1024, hidden_size=96, intermediate_size=384, num_layers=3,
                        num_heads=3, num_kv_heads=1, rope_theta=10_000.0, max_position_embeddings=4096,
                        eos_token_ids=(2, 0), pad_token_id=0),
    "small": DecoderConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_layers=4,
                         num_heads=4, num_kv_heads=2, rope_theta=10_000.0, max_position_embeddings=4096,
                         eos_token_ids=(2, 0), pad_token_id=0),
}
