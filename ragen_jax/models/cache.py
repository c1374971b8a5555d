"""The KV cache and where one forward reads and writes it.

`KVCache` holds keys/values of every layer in preallocated slots, each slot valid or a hole
(docs/architecture.md#static-shapes-slots-with-holes); `positions_from_mask` gives the RoPE
positions that skip the holes. A `DecodeContext` says where one `Decoder.__call__` writes its
chunk, which slots it reads and which it returns. A decode loop of an unrolled model works on
a per-layer copy of the cache (`cpu_tuning.PerLayerKVCache`), which reads and writes alike.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from ragen_jax.models.config import ATTENTION_BLOCK, DecoderConfig
from ragen_jax.models.cpu_tuning import PerLayerKVCache


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
