"""Shapes of the Qwen2 forward tuned for XLA's CPU backend (the layers and `sampling.py` use them).

One switch, `on_cpu_per_device()`, decides where the CPU tuning applies: row chunks
(`in_row_chunks`: a chunk's activations stay in the caches) and a decode step's q/k/v in one
matmul (`fused_qkv`). Accelerators keep one large kernel and the sharded weights as they are.
A forward reads the switch once (`CpuPath.for_call`) and its layers ask the `CpuPath`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from ragen_jax.models.cache import DecodeContext
    from ragen_jax.models.config import DecoderConfig
    from ragen_jax.models.decoder import Decoder
    from ragen_jax.models.layers import Attention

CHUNK_FLOATS = 1 << 20  # 4 MB of f32: what one chunk's activations may take (see row_chunk)


def on_cpu_per_device() -> bool:
    """Whether the CPU tuning applies (row chunks, `in_row_chunks`; the fused q/k/v projection
    of a decode step, `fused_qkv`): on a single CPU device. Accelerators keep one large kernel and
    the sharded weights as they are; on a mesh a loop over the rows of a sharded batch puts
    collectives inside it (8 fake CPU devices deadlocked in them). Inside a `shard_map` over every
    mesh axis each device runs its own rows with no collectives, so it applies there too (a
    data-parallel `sampling.generate`). The platform is the traced mesh's, where there is one."""
    mesh = jax.sharding.get_abstract_mesh()
    per_device = jax.device_count() == 1 or (not mesh.empty and mesh.are_all_axes_manual)
    return _platform(mesh) == "cpu" and per_device


def _platform(mesh) -> str:
    """The platform a program is traced for: its mesh's devices' (a program compiled for a TPU
    topology from a CPU host, `plan --target`), else the default backend's."""
    device = None if mesh.empty else mesh.abstract_device
    return device.platform if device is not None else jax.default_backend()


# ----------------------------------------------------------------------------- row chunks


def row_chunk(rows: int, floats_per_row: int, minimum: int = 1) -> int:
    """Rows per chunk for `in_row_chunks`: all of them, except where `on_cpu_per_device` and the
    rows' activations exceed CHUNK_FLOATS; then as few equal chunks as keep each within it (or
    at `minimum` rows)."""
    return _chunk_rows(rows, floats_per_row, minimum) if on_cpu_per_device() else rows


def _chunk_rows(rows: int, floats_per_row: int, minimum: int) -> int:
    """`row_chunk` on one CPU device."""
    if rows * floats_per_row <= CHUNK_FLOATS:
        return rows
    pieces = -(-rows // max(minimum, CHUNK_FLOATS // floats_per_row))
    return -(-rows // pieces)  # equal chunks: the least padding


def in_row_chunks(fn, floats_per_row: int, *arrays: jax.Array, minimum: int = 1):
    """fn(*arrays), computed `row_chunk(rows, floats_per_row, minimum)` rows (leading axis) at a
    time in a loop; the last chunk is padded with zeros and its padding dropped. On CPU a
    chunk's activations then stay in the caches: the MLP of a 64 x 128-token prefill and a
    128-query attention block run 2-4x faster than in one piece (docs/benchmarks.md). Used when
    filling a KV cache only: the backward pass of the loop is slower than the one-piece one (a
    training forward keeps it). A per-layer cache's leaves have kv_heads rows per sequence
    (see `map_row_blocks`)."""
    return map_row_blocks(fn, row_chunk(arrays[0].shape[0], floats_per_row, minimum), *arrays)


def map_row_blocks(fn, block: int, *arrays: jax.Array):
    """fn(*arrays) computed `block` rows (leading axis) at a time in a `lax.map` (all at once
    when block is 0 or covers them); the last block is padded with zeros and its padding
    dropped. fn may return a pytree whose leaves have a leading axis of any whole multiple of
    the input rows."""
    rows, chunk = arrays[0].shape[0], block
    if not chunk or chunk >= rows:
        return fn(*arrays)
    pad = (-rows) % chunk
    pieces = [jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)).reshape(-1, chunk, *a.shape[1:])
              for a in arrays]
    out = jax.lax.map(lambda xs: fn(*xs), pieces)
    return jax.tree.map(lambda o: o.reshape(-1, *o.shape[2:])[:o.shape[1] // chunk * rows], out)


# ----------------------------------------------------------------------------- fused q/k/v


def concat_qkv(attn: Attention) -> tuple[jax.Array, jax.Array]:
    """An attention layer's q, k and v projections as one kernel [hidden, (heads + 2 kv_heads) *
    head_dim] and its bias (None without biases: the Llama family; see `fused_qkv`)."""
    parts = (attn.q_proj, attn.k_proj, attn.v_proj)
    kernel = jnp.concatenate([p.merged_kernel() for p in parts], axis=1)  # LoRA adapters folded in
    return kernel, None if parts[0].bias is None else jnp.concatenate([p.bias[...] for p in parts])


def fused_qkv(model: Decoder) -> tuple[tuple[jax.Array, jax.Array], ...] | None:
    """`DecodeContext.fused_qkv` for a decode loop: every layer's q/k/v kernels as one
    (`concat_qkv`) where `on_cpu_per_device` — a CPU matmul over a decode step's few rows costs
    about the same for 256 or 512 outputs, and a `small` decode step is ~3% faster — else None
    (each projection its own matmul, sharded as its weights are). A decode loop builds it once."""
    if model.cfg.scan_layers or not on_cpu_per_device():
        return None
    return tuple(concat_qkv(block.self_attn) for block in model.layers)


# ----------------------------------------------------------------------------- one forward's path


@dataclasses.dataclass(frozen=True)
class CpuPath:
    """What one forward computes differently on one CPU device, decided once for the call
    (`for_call`, in `Decoder.__call__`): its layers ask this object, not the switch.

    `fills_cache`: the call writes or reads a KV cache; its MLP and each prefill attention block
    then go through `rows` (a training forward without a cache keeps one piece: the backward
    pass of a loop over chunks is slower). `on_cpu`: `on_cpu_per_device()` when the call began;
    only then does `rows` split large inputs. `qkv`: each layer's fused q/k/v kernel and bias
    (`DecodeContext.fused_qkv`), or None."""

    fills_cache: bool = False
    on_cpu: bool = False
    qkv: tuple[tuple[jax.Array, jax.Array], ...] | None = None

    @classmethod
    def for_call(cls, context: DecodeContext) -> CpuPath:
        return cls(context.cache is not None, on_cpu_per_device(), context.fused_qkv)

    def layer_qkv(self, layer) -> tuple[jax.Array, jax.Array] | None:
        """Layer `layer`'s q/k/v kernel and bias as one (`concat_qkv`), or None: separate projections."""
        return None if self.qkv is None else self.qkv[layer]

    def rows(self, fn, floats_per_row: int, *arrays: jax.Array, minimum: int = 1):
        """fn(*arrays), on one CPU device in row chunks of `row_chunk` rows (see `in_row_chunks`)."""
        block = _chunk_rows(arrays[0].shape[0], floats_per_row, minimum) if self.on_cpu else 0
        return map_row_blocks(fn, block, *arrays)
