"""Log-probabilities and entropies of the LM head, over the vocabulary and the positions in chunks.

`token_logprobs` / `logprobs_at` are what the loss and the diagnostics call: the model's
log-probabilities of given tokens, computed a chunk of positions at a time (and, with
`DecoderConfig.vocab_chunk`, a chunk of the vocabulary at a time by `chunked_logprobs`).

For a 152K vocabulary the f32 logits of a few thousand positions are gigabytes; the loss only
needs, per position, the target's log-probability and the distribution's entropy. Here the
positions are taken `rows` at a time and, for each block, the vocabulary `chunk` entries at a
time with a running maximum (an online log-sum-exp), so at most [rows, chunk] logits exist.
The gradient is written by hand (`jax.custom_vjp`) and visits the chunks again, recomputing
their logits: autodiff of the loops would keep every chunk's logits (and hoist per-chunk masks
and weight slices out of them), the whole vocabulary again. With l = h·Wᵀ, p = softmax(l),
H = −Σ p log p:

    ∂ log p_t / ∂ l_v = [v = t] − p_v          ∂H / ∂ l_v = −p_v (log p_v + H)

When `chunk` does not divide the vocabulary, the last chunk is the vocabulary's last `chunk`
entries and the ones it shares with the chunk before are skipped (no padded copy of the head).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from ragen_jax.models.decoder import Decoder

_NEG_INF = -jnp.inf


def _layout(vocab: int, chunk: int) -> tuple[int, int]:
    """(entries per chunk, number of chunks) for a vocabulary visited `chunk` entries at a time."""
    chunk = min(chunk, vocab)
    return chunk, -(-vocab // chunk)


def _chunk_logits(hidden, weight, c, chunk):
    """f32 logits [N, chunk] of chunk c, its vocabulary ids, an additive mask [chunk] (−∞ on
    entries the chunk before holds: the last chunk is the vocabulary's tail) and its weights."""
    vocab = weight.shape[0]
    start = jnp.minimum(c * chunk, vocab - chunk)
    w_chunk = jax.lax.dynamic_slice_in_dim(weight, start, chunk)
    logits = jnp.einsum("nd,vd->nv", hidden, w_chunk, preferred_element_type=jnp.float32)
    ids = start + jnp.arange(chunk)
    return logits, ids, jnp.where(ids >= c * chunk, 0.0, _NEG_INF), w_chunk


def _blocks(n: int, rows: int) -> tuple[int, int]:
    """(rows per block, number of blocks) for n positions taken `rows` at a time."""
    rows = min(rows, n) if rows else n
    return rows, -(-n // rows)


def _padded(x, rows, count):
    return jnp.pad(x, ((0, rows * count - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def chunked_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk: int, rows: int = 0):
    """(log p(targets), entropy), both f32 [N], for hidden [N, d] and head weight [V, d] (in
    the compute dtype): `rows` positions (0: all) and `chunk` vocabulary entries at a time."""
    return _forward(hidden, weight, targets, chunk, rows)[0]


def _block_forward(hidden, weight, targets, chunk, count):
    """log p(targets), entropy and log-sum-exp of one block of positions."""
    n = hidden.shape[0]

    def visit(carry, c):
        top, total, weighted, picked = carry
        logits, ids, mask, _ = _chunk_logits(hidden, weight, c, chunk)
        masked = logits + mask[None, :]
        new_top = jnp.maximum(top, jnp.max(masked, axis=1))
        rescale = jnp.exp(top - new_top)
        e = jnp.exp(masked - new_top[:, None])  # 0 on entries not this chunk's
        total = total * rescale + jnp.sum(e, axis=1)
        weighted = weighted * rescale + jnp.sum(e * logits, axis=1)
        hit = (ids[None, :] == targets[:, None]) & (mask[None, :] == 0.0)
        picked = picked + jnp.sum(jnp.where(hit, logits, 0.0), axis=1)
        return (new_top, total, weighted, picked), None

    zeros = jnp.zeros((n,), jnp.float32)
    (top, total, weighted, picked), _ = jax.lax.scan(visit, (jnp.full((n,), _NEG_INF), zeros, zeros, zeros),
                                                     jnp.arange(count))
    lse = top + jnp.log(total)
    return picked - lse, lse - weighted / total, lse


def _forward(hidden, weight, targets, chunk, rows):
    n = hidden.shape[0]
    chunk, count = _layout(weight.shape[0], chunk)
    rows, blocks = _blocks(n, rows)
    h = _padded(hidden, rows, blocks).reshape(blocks, rows, -1)
    t = _padded(targets, rows, blocks).reshape(blocks, rows)
    logp, entropy, lse = jax.lax.map(lambda a: _block_forward(a[0], weight, a[1], chunk, count), (h, t))
    logp, entropy, lse = (x.reshape(-1)[:n] for x in (logp, entropy, lse))
    return (logp, entropy), (hidden, weight, targets, lse, entropy)


def _backward(chunk, rows, residuals, cotangents):
    hidden, weight, targets, lse, entropy = residuals
    g_logp, g_entropy = cotangents
    n, vocab = hidden.shape[0], weight.shape[0]
    chunk, count = _layout(vocab, chunk)
    rows, blocks = _blocks(n, rows)
    pad = lambda x: _padded(x, rows, blocks).reshape(blocks, rows, *x.shape[1:])
    h, t, lse, entropy, g_logp, g_entropy = (pad(x) for x in (hidden, targets, lse, entropy, g_logp, g_entropy))

    def vocab_chunk(d_hidden, c):
        """This chunk's weight gradient, summed over the blocks of positions; each block's
        hidden-state gradient accumulated."""

        def block(i, carry):
            d_hidden, d_w = carry
            logits, ids, mask, w_chunk = _chunk_logits(h[i], weight, c, chunk)
            logp = logits - lse[i][:, None]
            p = jnp.exp(logp + mask[None, :])  # 0 on entries not this chunk's
            target = (ids[None, :] == t[i][:, None]) & (mask[None, :] == 0.0)
            d_logits = (g_logp[i][:, None] * (jnp.where(target, 1.0, 0.0) - p)
                        - g_entropy[i][:, None] * p * (logp + entropy[i][:, None]))
            d_logits = d_logits.astype(hidden.dtype)
            d_h = jnp.einsum("nv,vd->nd", d_logits, w_chunk, preferred_element_type=jnp.float32)
            d_hidden = d_hidden.at[i].add(d_h)
            return d_hidden, d_w + jnp.einsum("nv,nd->vd", d_logits, h[i], preferred_element_type=jnp.float32)

        d_w = jnp.zeros((chunk, weight.shape[1]), jnp.float32)
        d_hidden, d_w = jax.lax.fori_loop(0, blocks, block, (d_hidden, d_w))
        return d_hidden, d_w.astype(weight.dtype)

    d_hidden, d_w = jax.lax.scan(vocab_chunk, jnp.zeros(h.shape, jnp.float32), jnp.arange(count))
    d_w = d_w.reshape(count * chunk, -1)
    overlap = count * chunk - vocab  # the last chunk's rows that the one before holds (zero here)
    d_w = jnp.concatenate([d_w[:(count - 1) * chunk], d_w[(count - 1) * chunk + overlap:]])
    return d_hidden.reshape(-1, hidden.shape[1])[:n].astype(hidden.dtype), d_w, None


chunked_logprobs.defvjp(_forward, _backward)


# ----------------------------------------------------------------------------- positions in chunks


def token_logprobs(model: Decoder, hidden: jax.Array, targets: jax.Array, *,
                   chunk_size: int = 128, with_entropy: bool = False):
    """log p(targets[b, i] | hidden[b, i]) for hidden [B, N, d], in chunks of N.

    Only [B, chunk_size, vocab] logits exist at a time, and each chunk is rematerialised in
    the backward pass, so a 152K vocabulary never yields a [B, T, vocab] tensor. With
    `cfg.vocab_chunk` the vocabulary is visited in chunks too (`chunked_logprobs`): at
    most [B, chunk_size, vocab_chunk] logits.
    Returns logprobs [B, N] (f32), plus the full-distribution entropy [B, N] if asked.
    """
    b, n, d = hidden.shape
    if model.cfg.vocab_chunk:  # its gradient keeps only what the backward pass needs (below)
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
