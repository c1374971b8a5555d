"""The decoder's layers in Flax NNX, named after transformers' module tree (checkpoint names map
mechanically; kernels stored [in, out]): `Linear`, `RMSNorm`, `Attention`, `MLP` and the
`Block` that joins them.

Weights are stored in `param_dtype` and cast to the compute `dtype` at use. Every parameter
carries a partition spec over the mesh axes `fsdp` and `tensor` (`nnx.get_partition_spec`).
A layer gets what every layer of a forward shares in one `LayerInputs`; the CPU-only shapes it
takes are its `cpu_tuning.CpuPath`'s to say.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core.sharding import FSDP, TENSOR
from ragen_jax.models.cache import KVCache, PerLayerKVCache
from ragen_jax.models.config import LORA_TARGETS, REMAT_POLICIES, DecoderConfig
from ragen_jax.models.cpu_tuning import CpuPath
from ragen_jax.models.rope import apply_rope

_NEG_INF = -1e30


def param(rngs: nnx.Rngs | None, shape, cfg: DecoderConfig, spec, init: str = "normal") -> nnx.Param:
    """A weight in `param_dtype` with partition spec `spec`: normal(0, initializer_range), ones or zeros."""
    dtype = jnp.dtype(cfg.param_dtype)
    if init == "normal":
        value = cfg.initializer_range * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), out_sharding=spec, eager_sharding=False)


def set_config(model: nnx.Module, cfg: DecoderConfig) -> None:
    """Give every module of `model` that holds a `DecoderConfig` (the model and its layers) `cfg`,
    in place: what reads `.cfg` then follows (adapters added, layers unrolled)."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "cfg", None), DecoderConfig):
            node.cfg = cfg


def remat(cfg: DecoderConfig, fn, **options):
    """fn rematerialised in the backward pass, keeping what `cfg.remat_policy` names, when
    `cfg.remat`; else fn. `options` go to `jax.checkpoint`."""
    if not cfg.remat:
        return fn
    return jax.checkpoint(fn, policy=REMAT_POLICIES[cfg.remat_policy], **options)


def pick_slots(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[b, idx[b]] for x [B, T, ...], keeping a time axis of 1."""
    return jnp.take_along_axis(x, idx.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)


@dataclasses.dataclass(frozen=True)
class LayerInputs:
    """What every layer of one forward reads besides its hidden states and the cache: RoPE
    tables cos/sin [B, T, head_dim], the key slots each query slot attends to [B, T, S], the
    chunk's slot `offset` in the cache, the query block (`DecodeContext.query_block`), the
    call's CPU path and its LoRA dropout key (a training forward with `model.lora.dropout` > 0;
    else None, and no dropout is traced)."""

    cos: jax.Array
    sin: jax.Array
    attn_mask: jax.Array
    offset: jax.Array | int
    query_block: int
    cpu: CpuPath
    dropout_key: jax.Array | None = None

    def lora_key(self, layer, name: str) -> jax.Array | None:
        """The dropout key of layer `layer`'s projection `name`: the forward's key folded with the
        layer index (traced in a scanned model: the same masks as unrolled), then the name's
        index in LORA_TARGETS; None without dropout."""
        if self.dropout_key is None:
            return None
        return jax.random.fold_in(jax.random.fold_in(self.dropout_key, layer), LORA_TARGETS.index(name))


class RMSNorm(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.weight = param(rngs, (cfg.hidden_size,), cfg, (None,), "ones")
        self.eps = cfg.rms_norm_eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


def affine(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x @ kernel (+ bias) in x's dtype."""
    y = x @ kernel.astype(x.dtype)
    return y if bias is None else y + bias.astype(x.dtype)


def dropout(x: jax.Array, key: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: each entry of x zeroed with probability `rate`, the others scaled by
    1 / (1 - rate) (the expectation kept), the mask drawn by `jax.random.bernoulli` from `key`."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


class LoRAParam(nnx.Param):
    """A LoRA adapter's weight (`Linear.add_adapter`): the only parameters a LoRA run trains
    (filters select them by this type; every `nnx.Param` filter includes them)."""


class Linear(nnx.Module):
    """y = x @ kernel (+ bias); kernel stored [in, out] (the transpose of Hugging Face's).

    With an adapter (`add_adapter`, models/lora.py): y + (alpha / rank) · (x @ lora_a) @ lora_b,
    lora_a [in, rank], lora_b [rank, out] (a scanned model's with a leading layer axis), unless
    `lora_on` is switched off (`lora.adapters_off`: the base model, the same weights). Given a
    dropout key (`LayerInputs.lora_key`: a training forward), the adapter reads x through
    `dropout` at rate `lora_dropout` (peft's lora_dropout); the base projection reads x as is."""

    def __init__(self, cfg, rngs, d_in, d_out, spec, bias=False):
        self.kernel = param(rngs, (d_in, d_out), cfg, spec)
        self.bias = param(rngs, (d_out,), cfg, (spec[1],), "zeros") if bias else None

    def __call__(self, x, dropout_key: jax.Array | None = None):
        y = affine(x, self.kernel[...], None if self.bias is None else self.bias[...])
        if self.adapted:
            if dropout_key is not None and self.lora_dropout:
                x = dropout(x, dropout_key, self.lora_dropout)
            delta = (x @ self.lora_a[...].astype(x.dtype)) @ self.lora_b[...].astype(x.dtype)
            y = y + delta * jnp.asarray(self.lora_scale, x.dtype)
        return y

    @property
    def adapted(self) -> bool:
        """Whether the adapter counts in this layer's outputs (it has one, switched on)."""
        return getattr(self, "lora_on", False)

    def add_adapter(self, a: jax.Array, alpha: float, dtype, dropout_rate: float = 0.0) -> None:
        """An adapter for this projection: lora_a = `a` [(layers,) in, rank] (models/lora.py
        draws it), lora_b zero, scaled by alpha / rank, its input dropped at `dropout_rate` in
        the forwards given a key. Their large axis (in, out) is split over `fsdp` whatever the
        kernel's (the rank axis is small): each device holds 1/fsdp of the adapters and of their
        optimiser moments."""
        spec = self.kernel.get_metadata("out_sharding")
        lead, rank, d_out = self.kernel.shape[:-2], a.shape[-1], self.kernel.shape[-1]
        lead_spec = tuple(spec[:-2])
        self.lora_a = LoRAParam(a.astype(dtype), out_sharding=(*lead_spec, FSDP, None), eager_sharding=False)
        self.lora_b = LoRAParam(jnp.zeros((*lead, rank, d_out), dtype), out_sharding=(*lead_spec, None, FSDP),
                                eager_sharding=False)
        self.lora_scale = float(alpha) / rank
        self.lora_dropout = float(dropout_rate)
        self.lora_on = True

    def merged_kernel(self) -> jax.Array:
        """The kernel with the adapter folded in (kernel + alpha / rank · lora_a @ lora_b), in
        float32; the kernel itself without one (or switched off)."""
        kernel = self.kernel[...]
        if not self.adapted:
            return kernel
        delta = jnp.matmul(self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32))
        return kernel.astype(jnp.float32) + self.lora_scale * delta


class Attention(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        bias = cfg.attention_bias
        self.q_proj = Linear(cfg, rngs, d, cfg.num_heads * hd, (FSDP, TENSOR), bias=bias)
        self.k_proj = Linear(cfg, rngs, d, cfg.num_kv_heads * hd, (FSDP, TENSOR), bias=bias)
        self.v_proj = Linear(cfg, rngs, d, cfg.num_kv_heads * hd, (FSDP, TENSOR), bias=bias)
        self.o_proj = Linear(cfg, rngs, cfg.num_heads * hd, d, (TENSOR, FSDP))

    def __call__(self, x, inputs: LayerInputs, cache: KVCache | PerLayerKVCache | None, layer: int, query=None):
        """x [B, T, hidden] -> (attention output, cache with this chunk's keys/values written).
        `query` [B]: the output of one slot per row only (see DecodeContext.query)."""
        key = functools.partial(inputs.lora_key, layer)
        q, k, v = self._project(x, inputs.cos, inputs.sin, query, inputs.cpu.layer_qkv(layer), key)
        attn_mask = inputs.attn_mask if query is None else pick_slots(inputs.attn_mask, query)
        cache, k, v, layered = self._with_cache(cache, layer, k, v, inputs.offset, attn_mask.shape[-1], x.dtype)
        out = self._attend_in_blocks(q, k, v, attn_mask, inputs, layered)
        return self.o_proj(out, key("o_proj")), cache

    def _project(self, x, cos, sin, query, fused, key):
        """Queries [B, t, heads, head_dim] of the query slots (every slot, or `query`'s) and
        keys/values [B, kv_heads, T, head_dim] of every slot (the cache layout), RoPE applied.
        `fused`: the q/k/v kernel and bias as one (`cpu_tuning.concat_qkv`), or None. `key(name)`:
        a projection's LoRA dropout key (`LayerInputs.lora_key`), or None."""
        cfg = self.cfg
        b, t, _ = x.shape
        kvh, hd = cfg.num_kv_heads, cfg.head_dim
        if fused is None:
            k, v = self.k_proj(x, key("k_proj")), self.v_proj(x, key("v_proj"))
        else:
            every_q, k, v = jnp.split(affine(x, *fused), (cfg.num_heads * hd, (cfg.num_heads + kvh) * hd), axis=-1)
        k = apply_rope(k.reshape(b, t, kvh, hd), cos, sin).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, kvh, hd).transpose(0, 2, 1, 3)
        if query is not None:
            x, cos, sin = (pick_slots(a, query) for a in (x, cos, sin))
        if fused is None:
            q = self.q_proj(x, key("q_proj"))
        else:
            q = every_q if query is None else pick_slots(every_q, query)
        return apply_rope(q.reshape(b, q.shape[1], cfg.num_heads, hd), cos, sin), k, v

    def _with_cache(self, cache, layer, k, v, offset, slots: int, dtype):
        """(cache, keys, values, layered): this chunk's k/v written at slot `offset` and the
        first `slots` keys/values read back in `dtype` (`layered`: in a per-layer cache's layout,
        `PerLayerKVCache`). A shared cache is only read: its prefix goes before the chunk's."""
        if cache is None:
            return cache, k, v, False
        if cache.shared:  # every row behind one cached row: nothing written
            b = k.shape[0]
            prefix = (jnp.broadcast_to(a, (b, *a.shape[1:])).astype(dtype) for a in cache.read(layer, offset))
            k, v = (jnp.concatenate([p, a], axis=2) for p, a in zip(prefix, (k, v)))
            return cache, k, v, False
        cache = cache.write(layer, k, v, offset)
        if isinstance(offset, int) and offset == 0 and slots == k.shape[2]:
            # a chunk at slot 0 attends to exactly its own slots: no read back
            k, v = (a.astype(cache.dtype(layer)).astype(dtype) for a in (k, v))
            return cache, k, v, False
        # the key slots this call attends to (see DecodeContext.key_limit)
        k, v = (a.astype(dtype) for a in cache.read(layer, slots))
        return cache, k, v, cache.layered

    def _attend_in_blocks(self, q, k, v, attn_mask, inputs: LayerInputs, layered: bool):
        """`_attend` of the queries in blocks. Causal attention never looks past the query's own
        slot: with a static offset, a block of queries reads only the keys up to its last slot
        (half the score matrix on a long buffer, 2-3x faster on CPU, less memory). A traced
        offset (decoding) reads them all. A prefill's [rows, heads x queries x keys] scores go
        through `CpuPath.rows` (cache-sized pieces on one CPU device)."""
        cfg, offset = self.cfg, inputs.offset
        if cfg.attention != "einsum" and not layered:  # one fused call; the mask keeps it causal
            return remat(cfg, functools.partial(_attend_fused, implementation=cfg.attention),
                         prevent_cse=False)(q, k, v, attn_mask)
        t, slots = q.shape[1], attn_mask.shape[-1]
        block = inputs.query_block if isinstance(offset, int) and t > inputs.query_block else t
        # a block's scores are recomputed in its own backward pass: one block's live
        attend = remat(cfg, functools.partial(_attend, kvh=cfg.num_kv_heads, layered=layered), prevent_cse=False)
        chunked = inputs.cpu.fills_cache and not layered
        outs = []
        for start in range(0, t, block):
            stop = min(start + block, t)
            keys = slots if block == t else min(offset + stop, slots)
            ks = k[..., :keys] if layered else k[:, :, :keys]
            args = (q[:, start:stop], ks, v[..., :keys, :], attn_mask[:, start:stop, :keys])
            if chunked:
                outs.append(inputs.cpu.rows(attend, cfg.num_heads * (stop - start) * keys, *args))
            else:
                outs.append(attend(*args))
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


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
    scores = _scores(q, k, layered).reshape(b, kvh, t, groups, s) * (hd ** -0.5)
    scores = jnp.where(attn_mask[:, None, :, None], scores, _NEG_INF)
    # Softmax with the normalisation applied to the [.., hd] output instead of the [.., s]
    # weights: one pass over the scores fewer (1.5x faster attention on CPU at s = 128).
    e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    norm = jnp.sum(e, axis=-1)
    out = _mix(e.astype(q.dtype).reshape(b, kvh, t * groups, s), v, layered)
    out = out / norm.reshape(*out.shape[:-1], 1).astype(out.dtype)
    out = out.reshape(b, kvh, t, groups, hd)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, t, heads * hd)


def _attend_fused(q, k, v, attn_mask, implementation: str):
    """`_attend` by `jax.nn.dot_product_attention` (keys/values [B, kv_heads, s, hd], grouped
    query heads as transformers' repeat_kv orders them); returns [B, t, heads * hd]. A query
    slot with no key allowed (padding) gets an output nothing reads, as in `_attend`."""
    b, t, heads, hd = q.shape
    k, v = (a.transpose(0, 2, 1, 3) for a in (k, v))
    out = jax.nn.dot_product_attention(q, k, v, mask=attn_mask[:, None], implementation=implementation)
    return out.reshape(b, t, heads * hd)


def _scores(q, k, layered):
    """f32 scores of queries q [B, kv_heads, tq, hd] against the keys, [B, kv_heads, tq, s] (or
    [B * kv_heads, tq, s] when `layered`: B and kv_head merged as in the per-layer buffers, a
    reshape of which would copy them)."""
    if layered:
        b, kvh, tq, hd = q.shape
        return jnp.einsum("bqd,bds->bqs", q.reshape(b * kvh, tq, hd), k, preferred_element_type=jnp.float32)
    return jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)


def _mix(e, v, layered):
    """Weights e [B, kv_heads, tq, s] times the values: [B, kv_heads, tq, hd] (or
    [B * kv_heads, tq, hd] when `layered`, as `_scores`)."""
    if layered:
        b, kvh, tq, s = e.shape
        return jnp.einsum("bqs,bsd->bqd", e.reshape(b * kvh, tq, s), v)
    return jnp.einsum("bkqs,bksd->bkqd", e, v)


class MLP(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(cfg, rngs, d, i, (FSDP, TENSOR))
        self.up_proj = Linear(cfg, rngs, d, i, (FSDP, TENSOR))
        self.down_proj = Linear(cfg, rngs, i, d, (TENSOR, FSDP))

    def __call__(self, x, cpu: CpuPath = CpuPath(), key=lambda name: None):
        """SwiGLU; while a cache is filled, the [tokens, intermediate] activations go through
        `cpu.rows` (cache-sized pieces on one CPU device). `key(name)`: a projection's LoRA
        dropout key (`LayerInputs.lora_key`; a training forward, which fills no cache), or None."""
        if not cpu.fills_cache:
            return self._apply(x, key)
        flat = x.reshape(-1, x.shape[-1])
        out = cpu.rows(lambda rows: self._apply(rows, key), self.down_proj.kernel.shape[0], flat, minimum=16)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _apply(self, x, key):
        gate = jax.nn.silu(self.gate_proj(x, key("gate_proj")))
        return self.down_proj(gate * self.up_proj(x, key("up_proj")), key("down_proj"))


class Block(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg, rngs)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, h, inputs: LayerInputs, cache, layer, query=None):
        """One pre-norm layer: (hidden [B, T or 1, hidden], cache)."""
        attn, cache = self.self_attn(self.input_layernorm(h), inputs, cache, layer, query)
        h = (h if query is None else pick_slots(h, query)) + attn
        key = functools.partial(inputs.lora_key, layer)
        return h + self.mlp(self.post_attention_layernorm(h), inputs.cpu, key), cache
