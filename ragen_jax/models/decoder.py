"""The Qwen2/Qwen2.5 and Llama decoder family in Flax NNX, numerically matching Hugging Face
`Qwen2ForCausalLM` and `LlamaForCausalLM`: one code path, the families differing only in config
fields (`attention_bias`: Qwen2's q/k/v biases; `rope_type`: Llama 3's "llama3" scaling).

The model works on a fixed token buffer with *holes*
(docs/architecture.md#static-shapes-slots-with-holes): every call takes
token ids, per-token RoPE positions and a validity mask. A query slot attends to every valid
key slot at or before it, so masked slots in the middle of a sequence are invisible and the
model sees exactly the contiguous text. The same rule drives the KV cache: a chunk written at
offset `t` attends to the valid cache slots `<= t + i`.

Weights are stored in `param_dtype` and cast to the compute `dtype` at use. Every parameter
carries a partition spec over the mesh axes `fsdp` and `tensor` (`nnx.get_partition_spec`).
Shapes tuned for the CPU backend (row chunks, a fused q/k/v projection, a decode loop's
per-layer cache) live in `cpu_tuning`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from ragen_jax.core.sharding import FSDP, TENSOR, constrain_rows, traced_model_shards
from ragen_jax.models.cpu_tuning import PerLayerKVCache, in_row_chunks
from ragen_jax.models.head import chunked_logprobs

_NEG_INF = -1e30
ATTENTION_BLOCK = 128  # query slots per attention block on long inputs (see Attention)
PREFILL_BLOCK = 32  # the block `sampling.generate` uses for its prompt (see DecodeContext)
# The Hugging Face classes this decoder reproduces (`DecoderConfig.architecture`).
ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
ROPE_TYPES = ("default", "linear", "yarn", "llama3")
# What a rematerialised block keeps for its backward pass (a `jax.checkpoint` policy): "full"
# keeps only the block's input and recomputes the rest; "minimal" also keeps the outputs of its
# weight matmuls (projections and MLP, not the attention scores); "dots" keeps every matmul
# output, the attention scores included.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
}


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
    remat: bool = False  # rematerialise each block in the backward pass
    remat_policy: str = "full"  # what a rematerialised block keeps (REMAT_POLICIES)
    # One block with weights stacked [num_layers, ...] run by `lax.scan` (compile time
    # independent of depth), or a Python loop over `num_layers` blocks.
    scan_layers: bool = False
    # Log-probabilities over the vocabulary this many entries at a time (0: all at once; see
    # `token_logprobs`): the f32 logits of a 152K vocabulary are what the loss would hold most of.
    vocab_chunk: int = 0
    initializer_range: float = 0.02
    # The Hugging Face class the weights came from (one of ARCHITECTURES), written back on export.
    architecture: str = "Qwen2ForCausalLM"
    # Biases on the q/k/v projections (Qwen2: yes; Llama: none).
    attention_bias: bool = True

    def __post_init__(self):
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
        if self.vocab_chunk < 0:
            raise ValueError(f"vocab_chunk={self.vocab_chunk} must be >= 0 (0: the whole vocabulary at once)")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r} is not supported; allowed: "
                             f"{', '.join(REMAT_POLICIES)}")

    @classmethod
    def preset(cls, name: str, **overrides) -> "DecoderConfig":
        """A named configuration; keyword overrides replace fields (e.g. dtype="bfloat16")."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

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


# ----------------------------------------------------------------------------- RoPE


def rope_frequencies(cfg: DecoderConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim/2] and the cos/sin scale, as transformers computes them."""
    dim, base = cfg.head_dim, cfg.rope_theta
    extra = dict(cfg.rope_scaling)
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_type == "default":
        return inv_freq, 1.0
    factor = float(extra["factor"]) if extra.get("factor") is not None else None
    if cfg.rope_type == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
    if cfg.rope_type == "llama3":
        # Llama 3.1: wavelengths past orig / low_freq_factor divided by factor, those below
        # orig / high_freq_factor kept, a linear blend between
        orig = np.float32(extra.get("original_max_position_embeddings") or cfg.max_position_embeddings)
        low, high = np.float32(extra["low_freq_factor"]), np.float32(extra["high_freq_factor"])
        factor = np.float32(factor)
        wavelen = np.float32(2 * math.pi) / inv_freq
        scaled = np.where(wavelen > orig / low, inv_freq / factor, inv_freq)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    # yarn: blend interpolated and extrapolated frequencies with a linear ramp.
    orig = extra.get("original_max_position_embeddings") or cfg.max_position_embeddings
    if factor is None:
        factor = cfg.max_position_embeddings / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = extra.get("attention_factor")
    if attn is None:
        m, m_all = extra.get("mscale"), extra.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast, beta_slow = extra.get("beta_fast") or 32, extra.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if extra.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv.astype(np.float32), float(attn)


def rope_tables(cfg: DecoderConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, head_dim] in f32 for integer positions [B, T]."""
    inv_freq, scale = rope_frequencies(cfg)
    freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x [B, T, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


# ----------------------------------------------------------------------------- KV cache


@struct.dataclass
class KVCache:
    """Preallocated keys/values [layers, B, kv_heads, S, head_dim] and slot validity [B, S].
    A decode loop of an unrolled model works on a `cpu_tuning.PerLayerKVCache` copy instead."""

    k: jax.Array
    v: jax.Array
    mask: jax.Array

    @property
    def shared(self) -> bool:
        """One cached row that every row of the batch reads (keys/values [layers, 1, ...],
        mask [B, S]): a training forward over a prefix all rows share. Such a cache is only
        read; each row's own keys follow the prefix's. With one row it is told from a writable
        cache by its keys covering only the prefix, not the whole mask."""
        return self.k.shape[1] == 1 and (self.mask.shape[0] > 1 or self.k.shape[3] < self.mask.shape[1])

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def write(self, layer, k: jax.Array, v: jax.Array, offset) -> "KVCache":
        """Store k/v [B, kv_heads, T, head_dim] of `layer` at slot `offset` (`layer` may be
        traced: a scanned model's layer index)."""
        put = jax.lax.dynamic_update_slice
        at = (layer, 0, 0, offset, 0)
        return self.replace(k=put(self.k, k[None].astype(self.k.dtype), at),
                            v=put(self.v, v[None].astype(self.v.dtype), at))

    def read(self, layer, end: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of `layer` in slots [0, end): one slice of the stacked arrays (`layer`
        may be traced)."""
        take = lambda a: jax.lax.dynamic_slice(a, (layer, 0, 0, 0, 0), (1, *a.shape[1:3], end, a.shape[4]))[0]
        return take(self.k), take(self.v)

    def dtype(self, layer):
        return self.k.dtype


def init_cache(cfg: DecoderConfig, batch: int, length: int, dtype=None,
               layered: bool = False) -> KVCache | PerLayerKVCache:
    """An empty cache of `length` slots (every slot invalid), in the compute dtype by default.
    `layered`: already a decode loop's `PerLayerKVCache`, for a cache filled once at slot 0 and
    then only decoded into (what `sampling.generate` does): no stacked copy to build and
    convert. A scanned model reads its layers from the stacked form, so it ignores `layered`."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    if layered and not cfg.scan_layers:
        return PerLayerKVCache.empty(cfg, batch, length, dtype)
    mask = jnp.zeros((batch, length), bool)
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), mask)


def positions_from_mask(mask: jax.Array, start: jax.Array | int = 0) -> jax.Array:
    """RoPE positions that count only valid tokens: start + (#valid tokens before this slot)."""
    start = jnp.asarray(start, jnp.int32)
    if start.ndim == 1:
        start = start[:, None]
    return start + jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


@dataclasses.dataclass(frozen=True)
class DecodeContext:
    """Where one `Decoder.__call__` reads and writes a KV cache, and which slots it returns. The
    defaults are a plain forward: the T slots attend among themselves. Built inside the traced
    function (a Python int `offset` stays static).

    `cache`: the chunk is written at slot `offset` and attends to the cache's valid slots.

    `key_limit` (static): only cache slots below it are read (a bound the caller knows holds
    every valid key, e.g. the end of the current turn); by default `offset + T` when the offset
    is static, else the whole cache. Reading fewer slots is the main saving when decoding into a
    long buffer.

    `query` [B] (chunk indices): only those slots' hidden states [B, 1, hidden] are returned; the
    last layer then computes just keys/values for the other slots, a third of a 3-layer prefill
    saved when only the next-token logits are wanted.

    `rope` = rope_tables(cfg, arange(n)[None]): cos/sin looked up instead of computed (a decode
    loop computes them once; XLA would recompute them in every fusion reading them).

    `query_block` (static): with a static offset, queries are processed in blocks of this many
    slots, each reading only the keys up to its own last slot. The default (128) keeps the
    compiled train step small; `generate` prefills its prompt in blocks of PREFILL_BLOCK (32),
    which halves a 128-token prompt's attention time on CPU at the cost of a larger graph.

    `fused_qkv` = `cpu_tuning.fused_qkv(model)`: each layer's q, k and v in one matmul, built
    once before a decode loop."""

    cache: KVCache | PerLayerKVCache | None = None
    offset: jax.Array | int = 0
    key_limit: int | None = None
    query: jax.Array | None = None
    rope: tuple[jax.Array, jax.Array] | None = None
    query_block: int = ATTENTION_BLOCK
    fused_qkv: tuple[tuple[jax.Array, jax.Array], ...] | None = None


# ----------------------------------------------------------------------------- layers


def _param(rngs: nnx.Rngs | None, shape, cfg: DecoderConfig, spec, init: str = "normal") -> nnx.Param:
    dtype = jnp.dtype(cfg.param_dtype)
    if init == "normal":
        value = cfg.initializer_range * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), out_sharding=spec, eager_sharding=False)


class RMSNorm(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.weight = _param(rngs, (cfg.hidden_size,), cfg, (None,), "ones")
        self.eps = cfg.rms_norm_eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


def affine(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x @ kernel (+ bias) in x's dtype."""
    y = x @ kernel.astype(x.dtype)
    return y if bias is None else y + bias.astype(x.dtype)


class Linear(nnx.Module):
    """y = x @ kernel (+ bias); kernel stored [in, out] (the transpose of Hugging Face's)."""

    def __init__(self, cfg, rngs, d_in, d_out, spec, bias=False):
        self.kernel = _param(rngs, (d_in, d_out), cfg, spec)
        self.bias = _param(rngs, (d_out,), cfg, (spec[1],), "zeros") if bias else None

    def __call__(self, x):
        return affine(x, self.kernel[...], None if self.bias is None else self.bias[...])


class Attention(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        bias = cfg.attention_bias
        self.q_proj = Linear(cfg, rngs, d, cfg.num_heads * hd, (FSDP, TENSOR), bias=bias)
        self.k_proj = Linear(cfg, rngs, d, cfg.num_kv_heads * hd, (FSDP, TENSOR), bias=bias)
        self.v_proj = Linear(cfg, rngs, d, cfg.num_kv_heads * hd, (FSDP, TENSOR), bias=bias)
        self.o_proj = Linear(cfg, rngs, cfg.num_heads * hd, d, (TENSOR, FSDP))

    def __call__(self, x, cos, sin, attn_mask, cache: KVCache | PerLayerKVCache | None, layer: int, offset,
                 query=None, query_block: int = ATTENTION_BLOCK, fused=None):
        cfg = self.cfg
        b, t, _ = x.shape
        kvh, hd = cfg.num_kv_heads, cfg.head_dim
        if fused is None:
            k, v = self.k_proj(x), self.v_proj(x)
        else:  # `cpu_tuning.concat_qkv` (kernel, bias or None), computed once by the caller
            every_q, k, v = jnp.split(affine(x, *fused), (cfg.num_heads * hd, (cfg.num_heads + kvh) * hd), axis=-1)
        # keys/values as [B, kv_heads, T, head_dim], the cache layout
        k = apply_rope(k.reshape(b, t, kvh, hd), cos, sin).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, kvh, hd).transpose(0, 2, 1, 3)
        if query is not None:  # outputs of one slot per row only (see DecodeContext.query)
            x, cos, sin, attn_mask = (_pick(a, query) for a in (x, cos, sin, attn_mask))
            t = 1
        if fused is None:
            q = self.q_proj(x)
        else:
            q = every_q if query is None else _pick(every_q, query)
        q = apply_rope(q.reshape(b, t, cfg.num_heads, hd), cos, sin)
        layered = False  # keys read from a per-layer cache (see PerLayerKVCache)
        if cache is not None and cache.shared:  # every row behind one cached row: nothing written
            prefix = (jnp.broadcast_to(a, (b, *a.shape[1:])).astype(x.dtype) for a in cache.read(layer, offset))
            k, v = (jnp.concatenate([p, a], axis=2) for p, a in zip(prefix, (k, v)))
        elif cache is not None:  # write this chunk at `offset`, then attend over the buffer
            cache = cache.write(layer, k, v, offset)
            if isinstance(offset, int) and offset == 0 and attn_mask.shape[-1] == k.shape[2]:
                # a chunk at slot 0 attends to exactly its own slots: no read back
                k, v = (a.astype(cache.dtype(layer)).astype(x.dtype) for a in (k, v))
            else:  # the key slots this call attends to (see DecodeContext.key_limit)
                k, v = (a.astype(x.dtype) for a in cache.read(layer, attn_mask.shape[-1]))
                layered = isinstance(cache, PerLayerKVCache)
        # Causal attention never looks past the query's own slot: with a static offset, a block
        # of queries reads only the keys up to its last slot (half the score matrix on a long
        # buffer, 2-3x faster on CPU, less memory). A traced offset (decoding) reads them all.
        block = query_block if isinstance(offset, int) and t > query_block else t
        slots = attn_mask.shape[-1]
        attend = functools.partial(_attend, kvh=kvh, layered=layered)
        if cfg.remat:  # a block's scores are recomputed in its own backward pass: one block's live
            attend = jax.checkpoint(attend, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=False)
        outs = []
        for start in range(0, t, block):
            stop = min(start + block, t)
            keys = slots if block == t else min(offset + stop, slots)
            ks = k[..., :keys] if layered else k[:, :, :keys]
            args = (q[:, start:stop], ks, v[..., :keys, :], attn_mask[:, start:stop, :keys])
            if layered or cache is None:
                outs.append(attend(*args))
            else:  # prefill: the [rows, heads x queries x keys] scores in cache-sized pieces
                scores_per_row = cfg.num_heads * (stop - start) * keys
                outs.append(in_row_chunks(attend, scores_per_row, *args))
        out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
        return self.o_proj(out), cache


def _pick(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[b, idx[b]] for x [B, T, ...], keeping a time axis of 1."""
    return jnp.take_along_axis(x, idx.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)


def _attend(q, k, v, attn_mask, kvh, layered=False):
    """Softmax attention of queries q [B, t, heads, hd] over keys/values [B, kv_heads, s, hd]
    (or a per-layer cache's keys [B * kv_heads, hd, s] and values [B * kv_heads, s, hd] when
    `layered`) where attn_mask [B, t, s] allows; returns [B, t, heads * hd]."""
    b, t, heads, hd = q.shape
    groups, s = heads // kvh, attn_mask.shape[-1]
    # Query head h uses kv head h // groups (transformers' repeat_kv order). Time and groups
    # are merged into one matmul dimension, time-major: a plain batched matmul over
    # (B, kv_head) is several times faster on CPU than a 5-d einsum, and with one kv head the
    # [B, t, heads, hd] queries already have this layout (no transpose before or after).
    q = q.reshape(b, t, kvh, groups, hd).transpose(0, 2, 1, 3, 4).reshape(b, kvh, t * groups, hd)
    if layered:  # B and kv_head merged as in the buffers: a reshape of them would copy them
        scores = jnp.einsum("bqd,bds->bqs", q.reshape(b * kvh, t * groups, hd), k,
                            preferred_element_type=jnp.float32)
    else:
        scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, kvh, t, groups, s) * (hd ** -0.5)
    scores = jnp.where(attn_mask[:, None, :, None], scores, _NEG_INF)
    # Softmax with the normalisation applied to the [.., hd] output instead of the [.., s]
    # weights: one pass over the scores fewer (1.5x faster attention on CPU at s = 128).
    e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    norm = jnp.sum(e, axis=-1)
    e = e.astype(q.dtype)
    if layered:
        out = jnp.einsum("bqs,bsd->bqd", e.reshape(b * kvh, t * groups, s), v)
    else:
        out = jnp.einsum("bkqs,bksd->bkqd", e.reshape(b, kvh, t * groups, s), v)
    out = out / norm.reshape(*out.shape[:-1], 1).astype(out.dtype)
    out = out.reshape(b, kvh, t, groups, hd)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, t, heads * hd)


class MLP(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(cfg, rngs, d, i, (FSDP, TENSOR))
        self.up_proj = Linear(cfg, rngs, d, i, (FSDP, TENSOR))
        self.down_proj = Linear(cfg, rngs, i, d, (TENSOR, FSDP))

    def __call__(self, x, in_chunks: bool = False):
        """`in_chunks`: the [rows, intermediate] activations in cache-sized pieces (see
        in_row_chunks)."""
        if not in_chunks:
            return self._apply(x)
        flat = x.reshape(-1, x.shape[-1])
        out = in_row_chunks(self._apply, self.down_proj.kernel.shape[0], flat, minimum=16)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _apply(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg, rngs)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, h, cos, sin, attn_mask, cache, layer, offset, query=None, query_block=ATTENTION_BLOCK,
                 fused=None):
        attn, cache = self.self_attn(self.input_layernorm(h), cos, sin, attn_mask, cache, layer, offset, query,
                                     query_block, fused)
        h = (h if query is None else _pick(h, query)) + attn
        return h + self.mlp(self.post_attention_layernorm(h), in_chunks=cache is not None), cache


class Decoder(nnx.Module):
    """Decoder + LM head. `__call__` returns final-normed hidden states; `logits` projects them."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), cfg, (TENSOR, FSDP))
        blocks = [Block(cfg, rngs) for _ in range(cfg.num_layers)]
        self.layers = stack_blocks(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.norm = RMSNorm(cfg, rngs)
        # Stored [vocab, hidden] like the embedding, so tied and untied heads share code.
        self.lm_head = (None if cfg.tie_word_embeddings else
                        _param(rngs, (cfg.vocab_size, cfg.hidden_size), cfg, (TENSOR, FSDP)))

    def __call__(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
                 context: DecodeContext = DecodeContext()):
        """tokens, positions, mask: [B, T]. Without a cache in `context` the T slots attend among
        themselves; with one the chunk is written at slot `context.offset` and attends to the
        cache. Returns (hidden [B, T, hidden_size] in the compute dtype, cache); with
        `context.query` hidden is [B, 1, hidden_size]."""
        cfg = self.cfg
        cache, offset, key_limit, query = context.cache, context.offset, context.key_limit, context.query
        rope, query_block, fused = context.rope, context.query_block, context.fused_qkv
        dtype = jnp.dtype(cfg.dtype)
        mask = mask.astype(bool)
        h = jnp.take(self.embed_tokens[...], tokens, axis=0).astype(dtype)
        if rope is None:
            cos, sin = rope_tables(cfg, positions)
        else:
            cos, sin = (jnp.take(table[0], positions, axis=0) for table in rope)
        t = tokens.shape[1]
        if cache is None:
            key_valid, key_slot = mask, jnp.arange(t)
        else:
            cache = cache.replace(mask=jax.lax.dynamic_update_slice(cache.mask, mask, (0, offset)))
            end = key_limit if key_limit is not None else offset + t if isinstance(offset, int) else cache.length
            key_valid, key_slot = cache.mask[:, :end], jnp.arange(end)
        query_slot = offset + jnp.arange(t)
        attn_mask = (key_slot[None, :] <= query_slot[:, None])[None] & key_valid[:, None, :]

        def run(block, h, cache, layer, query, fused):
            return block(constrain_rows(h), cos, sin, attn_mask, cache, layer, offset, query, query_block, fused)

        policy = REMAT_POLICIES[cfg.remat_policy]
        if cfg.scan_layers:  # one block's program, run over the stacked weights
            graph, stacked = nnx.split(self.layers)
            # A shared cache is only read: each layer gets its slice as a scanned input (not a
            # loop carry, which rematerialisation would keep once per layer).
            shared = cache is not None and cache.shared
            layer_kv = (cache.k, cache.v) if shared else None

            def body(carry, xs):
                params, layer, kv = xs
                h, cache_in = carry
                if shared:
                    h, _ = run(nnx.merge(graph, params), h, KVCache(kv[0][None], kv[1][None], cache.mask), 0,
                               None, None)
                    return (h, cache_in), None
                return run(nnx.merge(graph, params), h, cache_in, layer, None, None), None

            if cfg.remat:
                body = jax.checkpoint(body, policy=policy, prevent_cse=False)
            carry = (h, None if shared else cache)
            (h, carried), _ = jax.lax.scan(body, carry, (stacked, jnp.arange(cfg.num_layers), layer_kv))
            cache = cache if shared else carried
            # every slot's output computed, then the asked ones picked (one program for all layers)
            h = h if query is None else _pick(h, query)
            return self.norm(h), cache
        for layer, block in enumerate(self.layers):
            pick = query if layer == len(self.layers) - 1 else None
            qkv = None if fused is None else fused[layer]
            if cfg.remat:
                h, cache = jax.checkpoint(run, static_argnums=(3,), policy=policy)(block, h, cache, layer, pick, qkv)
            else:
                h, cache = run(block, h, cache, layer, pick, qkv)
        return self.norm(h), cache

    def head_weight(self) -> jax.Array:
        return (self.embed_tokens if self.lm_head is None else self.lm_head)[...]

    def logits(self, hidden: jax.Array, vocab_major: bool = False) -> jax.Array:
        """f32 logits for hidden [..., hidden_size]. Only call on the positions you need.
        `vocab_major`: for hidden [..., T, hidden_size] return [..., vocab, T], so that the head's
        weight gradient contracts over T without a transposed copy of the logits (on CPU XLA
        copied every [T, vocab] block for it; see token_logprobs)."""
        w = self.head_weight().astype(hidden.dtype)
        spec = "vd,...td->...vt" if vocab_major else "...d,vd->...v"
        operands = (w, hidden) if vocab_major else (hidden, w)
        return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- stacked layers


def stack_blocks(blocks: list[Block]) -> Block:
    """One `Block` whose every weight is the layers' weights stacked on a new leading axis
    (replicated over the mesh: its partition spec gains a leading None)."""
    graph, _ = nnx.split(blocks[0])
    stacked = jax.tree.map(lambda *layers: jnp.stack(layers), *(nnx.state(b) for b in blocks))
    block = nnx.merge(graph, stacked)
    for _, var in nnx.iter_graph(block):
        if isinstance(var, nnx.Variable) and var.has_metadata("out_sharding"):
            var.set_metadata("out_sharding", (None, *var.get_metadata("out_sharding")))
    return block


def stacked_layout(tree: dict) -> bool:
    """Whether a model's state as a nested dict (`nnx.to_pure_dict`, an orbax tree) holds its
    layers stacked (a scanned model) rather than one entry per layer (keys 0, 1, … or "0", …)."""
    return not any(str(key).isdigit() for key in tree["layers"])


def stack_layers(tree: dict, stack=jnp.stack) -> dict:
    """A per-layer model state dict in the stacked layout; `stack(list of layer leaves)`."""
    layers = sorted(tree["layers"].items(), key=lambda item: int(item[0]))
    return {**tree, "layers": jax.tree.map(lambda *xs: stack(list(xs)), *(layer for _, layer in layers))}


def unstack_layers(tree: dict, num_layers: int, take=lambda x, i: x[i]) -> dict:
    """A stacked model state dict in the per-layer layout (keys 0 … num_layers − 1); `take(leaf,
    i)` is layer i's slice."""
    return {**tree, "layers": {i: jax.tree.map(lambda x: take(x, i), tree["layers"]) for i in range(num_layers)}}


def for_inference(model: Decoder) -> Decoder:
    """The model as the programs that only run it forward (rollout, diagnostics, validation) use
    it: weights cast to the compute dtype once up front instead of at every use inside their
    loops (the same numbers: every use casts its weight to the compute dtype), and, traced
    under a mesh that splits the model, the embedding/LM head whole on every device: every
    decode step reads all of it, and gathering it inside each turn's decode loop left one
    gathered copy per turn."""
    graph, state = nnx.split(model)
    if model.cfg.param_dtype != model.cfg.dtype:
        dtype = jnp.dtype(model.cfg.dtype)
        state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    model = nnx.merge(graph, state)
    if traced_model_shards() > 1:
        whole = lambda v: jax.lax.with_sharding_constraint(v, jax.sharding.PartitionSpec())
        model.embed_tokens.set_value(whole(model.embed_tokens[...]))
        if model.lm_head is not None:
            model.lm_head.set_value(whole(model.lm_head[...]))
    return model


def init_model(cfg: DecoderConfig, key: jax.Array) -> Decoder:
    """A randomly initialised model (normal(0, initializer_range) weights, unit norms)."""
    return Decoder(cfg, rngs=nnx.Rngs(params=key))


# ----------------------------------------------------------------------------- log-probs


def token_logprobs(model: Decoder, hidden: jax.Array, targets: jax.Array, *,
                   chunk_size: int = 128, with_entropy: bool = False):
    """log p(targets[b, i] | hidden[b, i]) for hidden [B, N, d], in chunks of N.

    Only [B, chunk_size, vocab] logits exist at a time, and each chunk is rematerialised in
    the backward pass, so a 152K vocabulary never yields a [B, T, vocab] tensor. With
    `cfg.vocab_chunk` the vocabulary is visited in chunks too (`head.chunked_logprobs`): at
    most [B, chunk_size, vocab_chunk] logits.
    Returns logprobs [B, N] (f32), plus the full-distribution entropy [B, N] if asked.
    """
    b, n, d = hidden.shape
    if model.cfg.vocab_chunk:  # its gradient keeps only what the backward pass needs (head.py)
        weight = model.head_weight().astype(hidden.dtype)
        picked, entropy = chunked_logprobs(hidden.reshape(-1, d), weight, targets.reshape(-1), model.cfg.vocab_chunk,
                                           b * chunk_size)
        picked, entropy = picked.reshape(b, n), entropy.reshape(b, n)
        return (picked, entropy) if with_entropy else picked
    chunk = min(chunk_size, n)
    pad = (-n) % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    num = (n + pad) // chunk
    hs = hidden.reshape(b, num, chunk, d).swapaxes(0, 1)
    ts = targets.reshape(b, num, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        h, tgt = args
        # vocabulary-major [B, vocab, chunk]: this piece's forward + backward 2.2x faster on CPU
        logp = jax.nn.log_softmax(model.logits(h, vocab_major=True), axis=1)
        picked = jnp.take_along_axis(logp, tgt[:, None, :], axis=1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp) * logp, axis=1)
        return picked, entropy

    picked, entropy = jax.lax.map(one, (hs, ts))
    picked = picked.swapaxes(0, 1).reshape(b, -1)[:, :n]
    entropy = entropy.swapaxes(0, 1).reshape(b, -1)[:, :n]
    return (picked, entropy) if with_entropy else picked


def logprobs_at(model: Decoder, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
                query_idx: jax.Array, targets: jax.Array, *, chunk_size: int = 128,
                with_entropy: bool = False):
    """Full forward over [B, T], then log-probs of `targets` [B, N] predicted at slots
    `query_idx` [B, N] (the slot holding the token *before* each target)."""
    hidden, _ = model(tokens, positions, mask)
    picked = jnp.take_along_axis(hidden, query_idx[..., None], axis=1)
    return token_logprobs(model, picked, targets, chunk_size=chunk_size, with_entropy=with_entropy)
