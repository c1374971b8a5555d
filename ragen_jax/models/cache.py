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
    """Preallocated keys/values [layers, B, kv_heads, S, head_dim] and slot validity [B, S].
    A decode loop of an unrolled model works on a `PerLayerKVCache` copy instead."""

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

    @property
    def layered(self) -> bool:
        """Whether `read` gives a per-layer cache's layout (`PerLayerKVCache`): not this one's."""
        return False

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
        layers, b, kvh, _, hd = cache.k.shape
        k = cache.k[:, :, :, :end].reshape(layers, b * kvh, end, hd).transpose(0, 1, 3, 2)
        v = cache.v[:, :, :, :end].reshape(layers, b * kvh, end, hd)
        return cls(tuple(k[i] for i in range(layers)), tuple(v[i] for i in range(layers)), cache.mask[:, :end])

    def merge_into(self, full: KVCache) -> KVCache:
        """The stacked cache `full` with slots [0, end) replaced by this cache's."""
        layers, b, kvh, _, hd = full.k.shape
        end = self.length
        k = jnp.stack(self.k).transpose(0, 1, 3, 2).reshape(layers, b, kvh, end, hd)
        v = jnp.stack(self.v).reshape(layers, b, kvh, end, hd)
        put = jax.lax.dynamic_update_slice
        return full.replace(k=put(full.k, k, (0,) * 5), v=put(full.v, v, (0,) * 5),
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
