"""The KV cache and where one forward reads and writes it.

`KVCache` holds keys/values of every layer in preallocated slots, each slot valid or a hole
(docs/architecture.md#static-shapes-slots-with-holes); `positions_from_mask` gives the RoPE
positions that skip the holes. A `DecodeContext` says where one `Decoder.__call__` writes its
chunk, which slots it reads and which it returns. A decode loop of an unrolled model
(`scan_layers=False`) works on a per-layer copy of the cache, `PerLayerKVCache`, on every
backend: each layer its own loop buffer, keys stored transposed; it reads and writes alike.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from ragen_jax.models.config import ATTENTION_BLOCK, DecoderConfig


@struct.dataclass
class KVCache:
    """Preallocated keys/values of every layer and slot validity [B, S]. `write` takes and
    `read` gives a layer's keys/values as [B, kv_heads, S, head_dim], the attention's layout;
    they are stored as `init_cache` chose from the model's `kv_layout` (models/config.py):
    [layers, B, kv_heads, S, head_dim], read in place, or with `heads_minor`
    [layers, B, S, kv_heads * head_dim], which a TPU stores without padding the head dimension.
    A decode loop of an unrolled model works on a `PerLayerKVCache` copy instead."""

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    kv_heads: int = struct.field(pytree_node=False)
    heads_minor: bool = struct.field(pytree_node=False, default=False)

    @property
    def slot_axis(self) -> int:
        """The axis of `k` and `v` that counts slots."""
        return 2 if self.heads_minor else 3

    @property
    def shared(self) -> bool:
        """One cached row that every row of the batch reads (keys/values [layers, 1, ...],
        mask [B, S]): a training forward over a prefix all rows share. Such a cache is only
        read; each row's own keys follow the prefix's. With one row it is told from a writable
        cache by its keys covering only the prefix, not the whole mask."""
        return self.k.shape[1] == 1 and (self.mask.shape[0] > 1 or self.k.shape[self.slot_axis] < self.mask.shape[1])

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def layered(self) -> bool:
        """Whether `read` gives a per-layer cache's layout (`PerLayerKVCache`): not this one's."""
        return False

    def write(self, layer, k: jax.Array, v: jax.Array, offset) -> "KVCache":
        """Store k/v [B, kv_heads, T, head_dim] of `layer` at slot `offset` (`layer` may be
        traced: a scanned model's layer index)."""
        put = jax.lax.dynamic_update_slice
        at = (layer, 0, offset, 0) if self.heads_minor else (layer, 0, 0, offset, 0)
        stored = lambda a, like: self._to_storage(a)[None].astype(like.dtype)
        return self.replace(k=put(self.k, stored(k, self.k), at), v=put(self.v, stored(v, self.v), at))

    def read(self, layer, end: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of `layer` in slots [0, end), [B, kv_heads, end, head_dim]: one slice
        of the stacked arrays (`layer` may be traced)."""
        def take(a):
            size = list(a.shape)
            size[0], size[self.slot_axis] = 1, end
            return self._from_storage(jax.lax.dynamic_slice(a, (layer,) + (0,) * (a.ndim - 1), size)[0])

        return take(self.k), take(self.v)

    def dtype(self, layer):
        return self.k.dtype

    def _to_storage(self, a: jax.Array) -> jax.Array:
        """[..., kv_heads, S, head_dim] as stored."""
        if not self.heads_minor:
            return a
        *lead, kvh, s, hd = a.shape
        return jnp.swapaxes(a, -3, -2).reshape(*lead, s, kvh * hd)

    def _from_storage(self, a: jax.Array) -> jax.Array:
        """Stored keys/values as [..., kv_heads, S, head_dim]."""
        if not self.heads_minor:
            return a
        *lead, s, width = a.shape
        return jnp.swapaxes(a.reshape(*lead, s, self.kv_heads, width // self.kv_heads), -3, -2)


def layout_for(platform: str) -> str:
    """What `kv_layout="auto"` stores on `platform`: heads-minor on a TPU, else heads-major."""
    return "heads_minor" if platform == "tpu" else "heads_major"


def stores_heads_minor(cfg: DecoderConfig) -> bool:
    """Whether `init_cache` stores keys/values heads-minor (`DecoderConfig.kv_layout`; "auto":
    `layout_for` the default backend)."""
    layout = layout_for(jax.default_backend()) if cfg.kv_layout == "auto" else cfg.kv_layout
    return layout == "heads_minor"


def init_cache(cfg: DecoderConfig, batch: int, length: int, dtype=None,
               layered: bool = False) -> KVCache | PerLayerKVCache:
    """An empty cache of `length` slots (every slot invalid), in the compute dtype by default,
    laid out as `cfg.kv_layout` says. `layered`: already a decode loop's `PerLayerKVCache`, for
    a cache filled once at slot 0 and then only decoded into (what `sampling.generate` does): no
    stacked copy to build and convert. A scanned model reads its layers from the stacked form,
    so it ignores `layered`."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    if layered and not cfg.scan_layers:
        return PerLayerKVCache.empty(cfg, batch, length, dtype)
    mask = jnp.zeros((batch, length), bool)
    minor = stores_heads_minor(cfg)
    shape = ((cfg.num_layers, batch, length, cfg.num_kv_heads * cfg.head_dim) if minor
             else (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim))
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), mask, cfg.num_kv_heads, minor)


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
    once before a decode loop (None off one CPU device); the layers get it through the call's
    `cpu_tuning.CpuPath`."""

    cache: KVCache | PerLayerKVCache | None = None
    offset: jax.Array | int = 0
    key_limit: int | None = None
    query: jax.Array | None = None
    rope: tuple[jax.Array, jax.Array] | None = None
    query_block: int = ATTENTION_BLOCK
    fused_qkv: tuple[tuple[jax.Array, jax.Array], ...] | None = None


@struct.dataclass
class PerLayerKVCache:
    """A decode loop's KV cache: per-layer keys [B * kv_heads, head_dim, S] and values
    [B * kv_heads, S, head_dim] (tuples over layers), slot validity [B, S]. Each layer is then
    its own loop buffer, written in place and read by the attention matmuls as is: slicing a
    layer out of the stacked array copies it every step, and on CPU the score matmul is ~2x
    faster with keys stored transposed. Reads and writes like `cache.KVCache`."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array

    @property
    def shared(self) -> bool:
        """Never one row read by all (see `KVCache.shared`)."""
        return False

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def layered(self) -> bool:
        """`read` gives keys [B * kv_heads, head_dim, S] and values [B * kv_heads, S, head_dim]."""
        return True

    @classmethod
    def empty(cls, cfg: DecoderConfig, batch: int, length: int, dtype) -> PerLayerKVCache:
        """`length` slots, every one invalid."""
        mask = jnp.zeros((batch, length), bool)
        rows, hd = batch * cfg.num_kv_heads, cfg.head_dim
        return cls(tuple(jnp.zeros((rows, hd, length), dtype) for _ in range(cfg.num_layers)),
                   tuple(jnp.zeros((rows, length, hd), dtype) for _ in range(cfg.num_layers)), mask)

    @classmethod
    def from_stacked(cls, cache: KVCache, end: int | None = None) -> PerLayerKVCache:
        """Slots [0, end) of a stacked cache (a copy; `merge_into` writes it back)."""
        end = cache.length if end is None else end
        k, v = (cache._from_storage(jax.lax.slice_in_dim(a, 0, end, axis=cache.slot_axis)) for a in (cache.k, cache.v))
        layers, b, kvh, _, hd = k.shape
        k = k.reshape(layers, b * kvh, end, hd).transpose(0, 1, 3, 2)
        v = v.reshape(layers, b * kvh, end, hd)
        return cls(tuple(k[i] for i in range(layers)), tuple(v[i] for i in range(layers)), cache.mask[:, :end])

    def merge_into(self, full: KVCache) -> KVCache:
        """The stacked cache `full` with slots [0, end) replaced by this cache's."""
        layers, b, end, kvh = full.k.shape[0], full.k.shape[1], self.length, full.kv_heads
        hd = self.v[0].shape[-1]
        k = jnp.stack(self.k).transpose(0, 1, 3, 2).reshape(layers, b, kvh, end, hd)
        v = jnp.stack(self.v).reshape(layers, b, kvh, end, hd)
        put = jax.lax.dynamic_update_slice
        start = (0,) * full.k.ndim
        return full.replace(k=put(full.k, full._to_storage(k), start), v=put(full.v, full._to_storage(v), start),
                            mask=put(full.mask, self.mask, (0, 0)))

    def write(self, layer: int, k: jax.Array, v: jax.Array, offset) -> PerLayerKVCache:
        """Store k/v [B, kv_heads, T, head_dim] of `layer` at slot `offset`."""
        put = jax.lax.dynamic_update_slice
        b, kvh, t, hd = k.shape
        new_k = put(self.k[layer], k.reshape(b * kvh, t, hd).transpose(0, 2, 1).astype(self.k[layer].dtype),
                    (0, 0, offset))
        new_v = put(self.v[layer], v.reshape(b * kvh, t, hd).astype(self.v[layer].dtype), (0, offset, 0))
        swap = lambda buf, x: buf[:layer] + (x,) + buf[layer + 1:]
        return self.replace(k=swap(self.k, new_k), v=swap(self.v, new_v))

    def read(self, layer: int, end: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of `layer` in slots [0, end), in this cache's layout."""
        k, v = self.k[layer], self.v[layer]
        return (k, v) if end == self.length else (k[..., :end], v[:, :end])

    def dtype(self, layer: int):
        return self.k[layer].dtype
