"""KV-cache sampling with static shapes: prefill a chunk, decode n steps, generate.

Everything works on a preallocated `KVCache` whose slots may hold holes
(docs/architecture.md#static-shapes-slots-with-holes).
Each call writes at a given slot offset, so the rollout can interleave "prefill the
observation at t" and "decode the answer from t'" on one cache, inside one jitted step.
RoPE positions come from the cache: a new token's position is the number of valid slots
before it, so holes never shift the text the model sees.

`prefill` and `decode` are traceable functions (call them inside your own jit);
`prefill_jit`, `decode_jit` and `generate` are jitted wrappers that donate the cache.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, PartitionSpec

from ragen_jax.models.cpu_tuning import fused_qkv, in_row_chunks
from ragen_jax.models.cache import DecodeContext, KVCache, PerLayerKVCache, init_cache, positions_from_mask
from ragen_jax.models.config import ATTENTION_BLOCK, PREFILL_BLOCK
from ragen_jax.models.decoder import Decoder
from ragen_jax.models.rope import rope_tables


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 switch those filters off.
    Static under jit (one compile per setting)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0")


GREEDY = SamplingParams(temperature=0.0)


@struct.dataclass
class DecodeOutput:
    """tokens [B, n] (pad after a sequence stops), logprobs [B, n] (0 after the stop),
    lengths [B] (generated tokens, stop token included), done [B], logits [B, V] after the
    last written token (feed them to the next `decode`)."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    done: jax.Array
    logits: jax.Array
    switched: jax.Array | None = None  # bool[B, n]: drawn with `switch_params` (see `decode`)


# ----------------------------------------------------------------------------- sampling


def filter_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Temperature, then top-k, then top-p (transformers' order); removed entries -> -inf."""
    logits = logits.astype(jnp.float32) / max(params.temperature, 1e-6)
    if params.top_k:
        kth = _kth_largest(logits, min(params.top_k, logits.shape[-1]))
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if params.top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
        keep_sorted = before < params.top_p  # the top token is always kept
        keep = jnp.zeros_like(keep_sorted).at[
            jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
        logits = jnp.where(keep, logits, -jnp.inf)
    return logits


SMALL_TOP_K = 32  # up to this k, `_kth_largest` removes maxima one by one


def _kth_largest(x: jax.Array, k: int) -> jax.Array:
    """The k-th largest entry of each row [B, 1], duplicates counted (as a sort would). For a
    small k: k - 1 rounds of "remove the first maximum" in plain reductions, because XLA's CPU
    top-k costs 22 ms on [128, 1024] logits — more than a small model's whole decode step —
    and four rounds 0.5 ms."""
    if k > SMALL_TOP_K:
        return jax.lax.top_k(x, k)[0][..., -1:]
    n = x.shape[-1]
    slots = jnp.arange(n)
    for _ in range(k - 1):
        top = jnp.max(x, axis=-1, keepdims=True)
        first = jnp.min(jnp.where(x == top, slots, n), axis=-1, keepdims=True)
        x = jnp.where(slots == first, -jnp.inf, x)
    return jnp.max(x, axis=-1, keepdims=True)


def _first_index_of_max(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (first maximum) as two plain reductions: XLA's CPU
    argmax (a variadic reduce) costs more than a whole decode step's MLP at vocab 1024."""
    n = x.shape[-1]
    hit = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.minimum(jnp.min(jnp.where(hit, jnp.arange(n), n), axis=-1), n - 1)


def _invert_cdf(cdf: jax.Array, u: jax.Array) -> jax.Array:
    """Index i with cdf[i-1] <= u < cdf[i] for a non-decreasing cdf [..., n], counted with
    sums (no argmax). u at or past the total (rounding) gives the last index that adds mass,
    so an entry of probability 0 is never returned."""
    below = jnp.sum(cdf <= u[..., None], axis=-1)
    last = jnp.sum(cdf < cdf[..., -1:], axis=-1)
    return jnp.minimum(below, last)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits) [B, V] (see `_draw`)."""
    return _draw(jax.random.uniform(key, logits.shape[:1], jnp.float32), jax.nn.softmax(logits, axis=-1))


def _draw(u: jax.Array, weights: jax.Array) -> jax.Array:
    """The draw for uniforms u [B] in [0, 1) from non-negative (unnormalised) weights [B, V]:
    inverts the CDF in two levels (the block of ~sqrt(V) entries, then the entry inside it).
    Gumbel noise per vocabulary entry (jax.random.categorical) and a full-vocabulary cumsum
    (a slow reduce-window on CPU) each cost more than the rest of a small model's decode
    step. Entries of weight 0 are never drawn."""
    b, v = weights.shape
    width = 1 << max(0, (v - 1).bit_length() + 1) // 2  # a power of two near sqrt(V)
    blocks = -(-v // width)
    weights = jnp.pad(weights.astype(jnp.float32), ((0, 0), (0, blocks * width - v))).reshape(b, blocks, width)
    mass = jnp.sum(weights, axis=-1)
    cdf = jnp.cumsum(mass, axis=-1)
    u = u * cdf[:, -1]
    block = _invert_cdf(cdf, u)
    inner = jnp.take_along_axis(weights, block[:, None, None], axis=1)[:, 0]
    before = jnp.take_along_axis(jnp.pad(cdf[:, :-1], ((0, 0), (1, 0))), block[:, None], axis=1)[:, 0]
    entry = _invert_cdf(jnp.cumsum(inner, axis=-1), u - before)
    return block * width + entry


def sample_token(key: jax.Array, logits: jax.Array, params: SamplingParams):
    """Next tokens [B] and their log-probs [B] under the temperature-scaled model
    distribution (log_softmax(logits / T), before top-k/top-p truncation; T=1 when greedy),
    i.e. what a training forward at the same temperature recomputes."""
    return _sample_token(jax.random.uniform(key, logits.shape[:1], jnp.float32), logits, params)


def _sample_token(u: jax.Array, logits: jax.Array, params: SamplingParams):
    """`sample_token` given its uniforms u [B] (unused when greedy). The log-prob is
    log_softmax's formula at the drawn token only; without top-k/top-p the draw reuses its
    exponentials (one pass over the vocabulary instead of three)."""
    logits = logits.astype(jnp.float32)
    scaled = logits / params.temperature if params.temperature else logits
    top = jnp.max(scaled, axis=-1, keepdims=True)
    weights = jnp.exp(scaled - top)
    if params.temperature == 0.0:
        token = _first_index_of_max(logits)
    elif params.top_k or params.top_p < 1.0:
        token = _draw(u, jax.nn.softmax(filter_logits(logits, params), axis=-1))
    else:
        token = _draw(u, weights)
    token = token.astype(jnp.int32)
    picked = jnp.take_along_axis(scaled - top, token[:, None], axis=-1)[:, 0]
    return token, picked - jnp.log(jnp.sum(weights, axis=-1))


def stop_on_suffix(sequences: list[list[int]]) -> Callable:
    """A stop condition: the generated tokens end with one of `sequences` (e.g. the token ids
    of `</answer>` in the contexts it can appear in)."""
    sequences = [tuple(int(t) for t in s) for s in sequences if len(s)]
    if not sequences:
        raise ValueError("stop_on_suffix needs at least one non-empty token sequence")

    def stop(tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        hit = jnp.zeros(lengths.shape, bool)
        for seq in sequences:
            idx = lengths[:, None] - len(seq) + jnp.arange(len(seq))[None]
            got = jnp.take_along_axis(tokens, jnp.clip(idx, 0, tokens.shape[1] - 1), axis=1)
            hit |= (lengths >= len(seq)) & jnp.all(got == jnp.asarray(seq)[None], axis=1)
        return hit

    return stop


# ----------------------------------------------------------------------------- cache steps


def _start_positions(cache: KVCache, offset) -> jax.Array:
    """Number of valid cache slots before `offset`, per sequence."""
    before = jnp.arange(cache.length)[None, :] < offset
    return jnp.sum(cache.mask & before, axis=-1).astype(jnp.int32)


def prefill(model: Decoder, cache: KVCache, tokens: jax.Array, mask: jax.Array, offset,
            prev_logits: jax.Array | None = None, query_block: int = ATTENTION_BLOCK):
    """Write the chunk tokens/mask [B, C] at slot `offset`; return (cache, logits [B, V]) of
    each sequence's last valid chunk token. Rows with no valid token in the chunk get
    `prev_logits` (or the logits of slot 0, meaningless, when it is None). `query_block`:
    see `DecodeContext` (smaller is faster on long chunks and compiles to a larger graph)."""
    mask = mask.astype(bool)
    positions = positions_from_mask(mask, _start_positions(cache, offset))
    # the last valid slot (0 for a row without one): a max, not an argmax of the reversed mask,
    # which XLA spends seconds constant-folding when the mask is a constant (the system prompt)
    last = jnp.max(jnp.where(mask, jnp.arange(tokens.shape[1]), 0), axis=1)
    rope = rope_tables(model.cfg, jnp.arange(cache.length)[None])  # a position is below its slot
    context = DecodeContext(cache, offset, query=last, rope=rope, query_block=query_block)
    hidden, cache = model(tokens, positions, mask, context)
    logits = model.logits(hidden[:, 0])
    if prev_logits is not None:
        logits = jnp.where(mask.any(axis=1, keepdims=True), logits, prev_logits)
    return cache, logits


def draw_uniforms(key: jax.Array, num_steps: int, batch: int, params: SamplingParams,
                  switch_params: SamplingParams | None = None) -> jax.Array:
    """Every decode step's uniforms [num_steps, batch] at once: random bits inside the loop
    cost several small kernels per step (threefry is itself a loop on CPU). Zeros when every
    draw is greedy."""
    greedy = params.temperature == 0.0 and (switch_params is None or switch_params.temperature == 0.0)
    if greedy:
        return jnp.zeros((num_steps, batch), jnp.float32)
    return jax.random.uniform(key, (num_steps, batch), jnp.float32)


def decode(model: Decoder, cache: KVCache | PerLayerKVCache, logits: jax.Array, offset, key: jax.Array, *,
           num_steps: int, params: SamplingParams = SamplingParams(),
           eos_ids: tuple[int, ...] = (), stop_fn: Callable | None = None,
           done: jax.Array | None = None, pad_id: int = 0,
           key_limit: int | None = None, switch_fn: Callable | None = None,
           switch_params: SamplingParams | None = None,
           uniforms: jax.Array | None = None) -> tuple[KVCache | PerLayerKVCache, DecodeOutput]:
    """Sample up to `num_steps` tokens into cache slots offset .. offset+num_steps-1.

    `logits` [B, V] is the next-token distribution (from `prefill` or a previous decode).
    A sequence stops after emitting an id in `eos_ids` or when `stop_fn(tokens, lengths)`
    is true; later slots are written as holes. Rows with `done` set never start. The loop is
    a while_loop that exits when every sequence has stopped. `key_limit` (static) bounds the
    cache slots attended to (and copied into the loop's per-layer buffers, see PerLayerKVCache):
    pass offset + num_steps when the offset is known statically. A cache already in the per-layer
    form (`init_cache(..., layered=True)`) is decoded into as it is, all of its slots read.

    `switch_fn(tokens, lengths)` (static, with `switch_params`) says after each token whether a
    sequence's next token is drawn with `switch_params` instead of `params` — the rollout draws
    the first token of each action in the answer at its own temperature. `DecodeOutput.switched`
    marks the tokens so drawn.

    `uniforms` [num_steps, B]: the draws to use instead of `key`'s (`draw_uniforms`); a
    data-parallel `generate` draws them for the whole batch, so its tokens do not depend on
    how the batch is split.
    """
    if (switch_fn is None) != (switch_params is None):
        raise ValueError("decode: switch_fn and switch_params go together")
    b = logits.shape[0]
    done = jnp.zeros((b,), bool) if done is None else done.astype(bool)
    eos = jnp.asarray(eos_ids or (-1,), jnp.int32)
    out = DecodeOutput(tokens=jnp.full((b, num_steps), pad_id, jnp.int32),
                       logprobs=jnp.zeros((b, num_steps), jnp.float32),
                       lengths=jnp.zeros((b,), jnp.int32), done=done, logits=logits,
                       switched=None if switch_fn is None else jnp.zeros((b, num_steps), bool))

    if uniforms is None:
        uniforms = draw_uniforms(key, num_steps, b, params, switch_params)

    def cond(carry):
        i, _, out, _ = carry
        return (i < num_steps) & ~jnp.all(out.done)

    def body(carry):
        i, cache, out, switched = carry
        token, logp = _sample_token(uniforms[i], out.logits, params)
        if switch_fn is not None:
            other, other_logp = _sample_token(uniforms[i], out.logits, switch_params)
            token, logp = jnp.where(switched, other, token), jnp.where(switched, other_logp, logp)
        active = ~out.done
        token = jnp.where(active, token, pad_id)
        tokens = out.tokens.at[:, i].set(token)
        lengths = out.lengths + active
        stopped = jnp.isin(token, eos)
        if stop_fn is not None:
            stopped |= stop_fn(tokens, lengths)
        slot = offset + i
        positions = _start_positions(cache, slot)[:, None]
        context = DecodeContext(cache, slot, key_limit=limit, rope=rope, fused_qkv=fused)
        hidden, cache = model(token[:, None], positions, active[:, None], context)
        out = DecodeOutput(tokens=tokens,
                           logprobs=out.logprobs.at[:, i].set(jnp.where(active, logp, 0.0)),
                           lengths=lengths, done=out.done | (active & stopped),
                           logits=model.logits(hidden[:, 0]),
                           switched=None if switch_fn is None else out.switched.at[:, i].set(active & switched))
        if switch_fn is not None:
            switched = active & switch_fn(tokens, lengths)
        return i + 1, cache, out, switched

    # The loop works on a per-layer copy of the slots it reads (PerLayerKVCache), then writes it
    # back; a cache already in that form is used as it is. A scanned model decodes into the
    # stacked cache in place, reading the slots below `key_limit`.
    layered = isinstance(cache, PerLayerKVCache)
    stacked = model.cfg.scan_layers and not layered
    work = cache if layered or stacked else PerLayerKVCache.from_stacked(cache, key_limit)
    limit = key_limit if stacked else None
    rope = rope_tables(model.cfg, jnp.arange(work.length)[None])  # every position a new token can get
    fused = fused_qkv(model)  # once per call, not once per step
    _, work, out, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), work, out, jnp.zeros((b,), bool)))
    return (work if layered or stacked else work.merge_into(cache)), out


prefill_jit = jax.jit(prefill, donate_argnames=("cache",), static_argnames=("query_block",))
decode_jit = jax.jit(decode, donate_argnames=("cache",),
                     static_argnames=("num_steps", "params", "eos_ids", "stop_fn", "pad_id", "key_limit",
                                      "switch_fn", "switch_params"))


@struct.dataclass
class GenerateOutput:
    tokens: jax.Array  # [B, max_new_tokens], pad after each sequence's stop
    logprobs: jax.Array  # [B, max_new_tokens]
    lengths: jax.Array  # [B]


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "params", "eos_ids", "stop_fn",
                                             "pad_id", "mesh"))
def generate(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array, *,
             max_new_tokens: int, params: SamplingParams = SamplingParams(),
             eos_ids: tuple[int, ...] = (), stop_fn: Callable | None = None,
             pad_id: int = 0, mesh: Mesh | None = None) -> GenerateOutput:
    """Sample continuations of prompts [B, P] (any padding side; masked slots are holes).

    `mesh`: split the batch over all of the mesh's devices, each generating its own rows with a
    full copy of the parameters and no communication (data parallel). On a CPU, one device per
    core (`--xla_force_host_platform_device_count`, `sharding.make_mesh((cores, 1, 1))`) is
    faster than one device running every op on all cores (docs/benchmarks.md). The tokens are
    those of the same call without a mesh: the uniforms are drawn for the whole batch first."""
    b = prompt.shape[0]
    uniforms = draw_uniforms(key, max_new_tokens, b, params)
    rows = functools.partial(_generate_rows, max_new_tokens=max_new_tokens, params=params,
                             eos_ids=eos_ids, stop_fn=stop_fn, pad_id=pad_id)
    if mesh is not None:
        if b % mesh.size:
            raise ValueError(f"generate: batch {b} must be divisible by the mesh's {mesh.size} devices")
        axes = mesh.axis_names
        split, step_major = PartitionSpec(axes), PartitionSpec(None, axes)
        # no collectives inside, so the loop-carry varying-axis check is not needed
        rows = jax.shard_map(rows, mesh=mesh, in_specs=(PartitionSpec(), split, split, step_major),
                             out_specs=split, check_vma=False)
    return rows(model, prompt, prompt_mask, uniforms)


def _generate_rows(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array, uniforms: jax.Array, *,
                   max_new_tokens: int, params: SamplingParams, eos_ids: tuple[int, ...],
                   stop_fn: Callable | None, pad_id: int) -> GenerateOutput:
    """`generate` on the rows in hand, with their uniforms [max_new_tokens, rows]."""
    p = prompt.shape[1]

    def fill(prompt, prompt_mask):  # a fresh cache in the decode loop's form, filled at slot 0
        cache = init_cache(model.cfg, prompt.shape[0], p + max_new_tokens, layered=True)
        return prefill(model, cache, prompt, prompt_mask, 0, query_block=PREFILL_BLOCK)

    # On one CPU device a few sequences at a time go through every layer, so each chunk's
    # activations stay in the caches (and the call needs half the temporaries). A scanned
    # model's stacked cache holds rows on its second axis, so it prefills in one piece.
    if model.cfg.scan_layers:
        cache, logits = fill(prompt, prompt_mask)
    else:
        cache, logits = in_row_chunks(fill, p * model.cfg.intermediate_size, prompt, prompt_mask)
    _, out = decode(model, cache, logits, p, None, num_steps=max_new_tokens, params=params,
                    eos_ids=eos_ids, stop_fn=stop_fn, pad_id=pad_id, uniforms=uniforms)
    return GenerateOutput(out.tokens, out.logprobs, out.lengths)
