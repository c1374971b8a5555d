"""Cross-scoring straight from rollout buffers: one prefill serves every pair set.

`cross_score` prefills one prompt array per pair set. Inside the train step the prompts are
all prefixes of the rollout buffers: turn t's prompt of trajectory b is row b before
`traj.layout.generation_offset(t)`, and a causal model's keys/values of a prefix do not depend
on what comes after it. So `prefill_buffers` runs the model once over the batch's buffers, and
every prompt of every set (first turn, trajectory, each turn index, and the [x, z] prefixes of
action grounding) is a (cache row, end slot) pair read from that one cache: its slots are the
row's valid slots before `end`.

`score_continuations` then scores continuations under such prompts. The prompt's last token
is fed again in front of the continuation (its cached slot is masked out), so the hidden state
that predicts the continuation's first token comes out of the same forward — no logits need to
be kept from the prefill. Columns are processed one at a time (`lax.scan`); each row may have
its own column list (`columns[i, c]`), which covers both the cross product of
docs/method.md#the-cross-scoring-matrix and the per-group reasoning swaps of action grounding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ragen_jax.core import sharding
from ragen_jax.core.sharding import constrain_rows, traced_row_shards
from ragen_jax.models.cpu_tuning import map_row_blocks
from ragen_jax.models.cache import DecodeContext, KVCache, init_cache, positions_from_mask, stores_heads_minor
from ragen_jax.models.decoder import Decoder
from ragen_jax.models.head import token_logprobs


def prefill_buffers(model: Decoder, tokens: jax.Array, mask: jax.Array, block_rows: int = 8,
                    mesh: jax.sharding.Mesh | None = None) -> KVCache:
    """Keys/values of whole buffers tokens/mask [R, L] (holes skipped, RoPE over valid slots),
    `block_rows` rows per forward (the attention scores of a forward are rows × L × L). On a
    data-only `mesh` each device prefills its own rows (`sharding.per_device_rows`)."""
    rows_spec = PartitionSpec(None, sharding.ROWS)  # cache keys/values: [layers, R, ...]
    return sharding.per_device_rows(lambda model, tokens, mask: _prefill(model, tokens, mask, block_rows), mesh,
                                    (model,), (tokens, mask),
                                    KVCache(rows_spec, rows_spec, PartitionSpec(sharding.ROWS), model.cfg.num_kv_heads,
                                            stores_heads_minor(model.cfg)))


def _prefill(model: Decoder, tokens: jax.Array, mask: jax.Array, block_rows: int) -> KVCache:
    """Each block's keys/values written into one preallocated cache (no stacked copy). Where
    the rows are split over a mesh (`sharding.constrain_rows`) they are prefilled in one block,
    each device its own, and the cache stays split."""
    rows, length = tokens.shape
    mask = mask.astype(bool)
    if traced_row_shards() > 1 and rows % traced_row_shards() == 0:
        tokens, mask = constrain_rows(tokens), constrain_rows(mask)
        _, cache = model(tokens, positions_from_mask(mask), mask, DecodeContext(init_cache(model.cfg, rows, length), 0))
        return cache.replace(k=constrain_rows(cache.k, 1), v=constrain_rows(cache.v, 1), mask=mask)
    block = max(d for d in range(1, min(block_rows, rows) + 1) if rows % d == 0)

    def one(i, cache):
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, i * block, block)
        ids, valid = take(tokens), take(mask)
        _, part = model(ids, positions_from_mask(valid), valid, DecodeContext(init_cache(model.cfg, block, length), 0))
        put = lambda whole, a: jax.lax.dynamic_update_slice_in_dim(whole, a, i * block, axis=1)
        return cache.replace(k=put(cache.k, part.k), v=put(cache.v, part.v))

    return jax.lax.fori_loop(0, rows // block, one, init_cache(model.cfg, rows, length).replace(mask=mask))


@dataclasses.dataclass(frozen=True)
class Scoring:
    """Where and how continuations are scored: on a data-only `mesh` each device scores its own
    rows (`sharding.per_device_rows`); `block_rows` rows at a time (0: all at once) bound the
    working set — the rows' prompt caches and their vocabulary log-probs. `span_buckets` > 1:
    each block is scored only as wide as its longest continuation needs (`span_widths`)."""

    mesh: jax.sharding.Mesh | None = None
    block_rows: int = 0
    span_buckets: int = 1


def score_continuations(
    model: Decoder,
    cache: KVCache,
    tokens: jax.Array,
    prompt_width: int,
    columns: jax.Array,
    ends: jax.Array,
    cont: jax.Array,
    cont_mask: jax.Array,
    own_column: jax.Array | None = None,
    scoring: Scoring = Scoring(),
    shared_columns: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """log p(cont[i, t] | prompt of column c, cont[i, <t]) for every row i and column slot c.

    cache / tokens: the prefilled buffers (`KVCache`, ids [R, L]).
    columns, ends: int32[M, C]: row i's column c is cache row `columns[i, c]`, valid slots
    before `ends[i, c]` (all below the static `prompt_width` ≤ L). cont, cont_mask [M, W]:
    left-aligned continuations (holes only after the last valid token).
    Returns f32[M, C, W] log-probs (0 where `cont_mask` is off) and, given `own_column` [M],
    the full-distribution entropy [M, W] at each row's own column (else None; 0 where
    `cont_mask` is off), placed and blocked as `scoring` says. `shared_columns` (static): every
    row's column c is the same cache row and end (a cross product), so each column step reads
    that one row's keys for all rows (a `KVCache.shared` cache) instead of a copy per row.
    """
    split = (columns, ends, cont, cont_mask) + (() if own_column is None else (own_column,))

    def score(model, cache, tokens, *rows):
        widths = span_widths(cont.shape[1], scoring.span_buckets)
        one_block = lambda *block: _score_spans(model, cache, tokens, prompt_width, shared_columns, widths, *block)
        return map_row_blocks(one_block, scoring.block_rows, *rows)

    return sharding.per_device_rows(score, scoring.mesh, (model, cache, tokens), split)


def span_widths(width: int, buckets: int) -> tuple[int, ...]:
    """The continuation widths a block may be scored at: `buckets` steps of width / buckets
    (rounded up, duplicates dropped), the last one the whole width."""
    return tuple(sorted({-(-width * k // buckets) for k in range(1, buckets + 1)}))


def _score_spans(model, cache, tokens, prompt_width, shared_columns, widths, columns, ends, cont, cont_mask,
                 own_column=None):
    """`_score` over only the first w slots of the continuations, w the narrowest of `widths`
    that holds every row's last valid token (a `lax.switch`: one program per width, the
    choice made at run time). A causal model's log-probs of those slots do not depend on the
    slots after them, so they are the full width's up to float rounding; the slots after w are
    0, as the full width's are (`cont_mask` is off there)."""
    width = cont.shape[1]
    if len(widths) == 1:
        return _score(model, cache, tokens, prompt_width, shared_columns, columns, ends, cont, cont_mask, own_column)

    def scored_at(w):
        def branch():
            logp, entropy = _score(model, cache, tokens, prompt_width, shared_columns, columns, ends, cont[:, :w],
                                   cont_mask[:, :w], own_column)
            widen = lambda a: jnp.pad(a, ((0, 0),) * (a.ndim - 1) + ((0, width - w),))
            return widen(logp), (None if entropy is None else widen(entropy))
        return branch

    return jax.lax.switch(span_choice(cont_mask, widths), [scored_at(w) for w in widths])


def span_choice(cont_mask: jax.Array, widths: tuple[int, ...]) -> jax.Array:
    """The index of the narrowest of `widths` (ascending) that holds the last valid slot of
    every row of `cont_mask` [M, W] (0 when none is valid)."""
    used = jnp.max(jnp.where(cont_mask.astype(bool), jnp.arange(1, cont_mask.shape[1] + 1)[None, :], 0))
    return jnp.searchsorted(jnp.asarray(widths), used)  # the first width >= used


def _score(model, cache, tokens, prompt_width, shared_columns, columns, ends, cont, cont_mask, own_column=None):
    num_rows, width = cont.shape
    cont_mask = cont_mask.astype(bool)
    prompt_valid = cache.mask[:, :prompt_width]
    prompt_ids = tokens[:, :prompt_width]
    slots = jnp.arange(prompt_width)[None, :]
    grow = [(0, 0)] * cache.k.ndim
    grow[cache.slot_axis] = (0, width + 1)
    want_entropy = own_column is not None

    def step(entropy, c):
        rows, end = columns[:, c], ends[:, c]
        valid = prompt_valid[rows] & (slots < end[:, None])
        last = jnp.max(jnp.where(valid, slots, -1), axis=1)  # the prompt's last token (-1: empty)
        last_id = prompt_ids[rows, jnp.maximum(last, 0)]
        before = valid & (slots < last[:, None])  # the cached prefix; the last token is re-fed
        mask = jnp.pad(before, ((0, 0), (0, width + 1)))
        if shared_columns and num_rows > 1:  # one cache row, read by every row
            column = cache.replace(k=_rows_up_to(cache.k, rows[:1], prompt_width, cache.slot_axis),
                                   v=_rows_up_to(cache.v, rows[:1], prompt_width, cache.slot_axis), mask=mask)
        else:
            gather = lambda a: jnp.pad(_rows_up_to(a, rows, prompt_width, cache.slot_axis), grow)
            column = cache.replace(k=gather(cache.k), v=gather(cache.v), mask=mask)
        chunk = jnp.concatenate([last_id[:, None], cont], axis=1)
        chunk_mask = jnp.concatenate([(last >= 0)[:, None], cont_mask], axis=1)
        positions = positions_from_mask(chunk_mask, before.sum(axis=1))
        hidden, _ = model(chunk, positions, chunk_mask, DecodeContext(column, prompt_width))
        if want_entropy:
            logp, ent = token_logprobs(model, hidden[:, :-1], cont, with_entropy=True)
            entropy = entropy + jnp.where((own_column == c)[:, None] & cont_mask, ent, 0.0)
        else:
            logp = token_logprobs(model, hidden[:, :-1], cont)
        return entropy, jnp.where(cont_mask, logp, 0.0)

    entropy, logp = jax.lax.scan(step, jnp.zeros((num_rows, width), jnp.float32), jnp.arange(columns.shape[1]))
    return jnp.moveaxis(logp, 0, 1), (entropy if want_entropy else None)


def _rows_up_to(a: jax.Array, rows: jax.Array, width: int, slot_axis: int) -> jax.Array:
    """Cache keys/values [layers, R, ...] at `rows`, their first `width` slots (on `slot_axis`),
    in one gather: slicing the whole cache to the width first would copy all of it."""
    size = list(a.shape)
    size[1], size[slot_axis] = 1, width
    numbers = jax.lax.GatherDimensionNumbers(offset_dims=(0, *range(2, a.ndim)), collapsed_slice_dims=(1,),
                                             start_index_map=(1,))
    return jax.lax.gather(a, rows[:, None], numbers, tuple(size),
                          mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def mean_and_sum(logp: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(L, Ls) [M, C] from log-probs [M, C, W]: token mean and token sum over `mask` [M, W]."""
    sums = jnp.sum(jnp.where(mask[:, None, :], logp, 0.0), axis=-1)
    lengths = mask.sum(axis=1, keepdims=True).astype(jnp.float32)
    return sums / jnp.maximum(lengths, 1.0), sums
