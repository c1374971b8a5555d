"""Log-probabilities and entropies of the LM head over the vocabulary in chunks.

For a 152K vocabulary the f32 logits of a few thousand positions are gigabytes; the loss only
needs, per position, the target's log-probability and the distribution's entropy. Here the
vocabulary is visited `chunk` entries at a time with a running maximum (an online
log-sum-exp), so at most [positions, chunk] logits exist. The gradient is written by hand
(`jax.custom_vjp`) and visits the chunks again, recomputing each chunk's logits: autodiff of
the forward loop would keep every chunk's logits for the backward pass, the whole vocabulary
again. With l = h·Wᵀ, p = softmax(l), H = −Σ p log p:

    ∂ log p_t / ∂ l_v = [v = t] − p_v          ∂H / ∂ l_v = −p_v (log p_v + H)

When `chunk` does not divide the vocabulary, the last chunk is the vocabulary's last `chunk`
entries and the ones it shares with the chunk before are skipped (no padded copy of the head).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def _layout(vocab: int, chunk: int) -> tuple[int, int]:
    """(entries per chunk, number of chunks) for a vocabulary visited `chunk` entries at a time."""
    chunk = min(chunk, vocab)
    return chunk, -(-vocab // chunk)


def _chunk_logits(hidden, weight, c, chunk):
    """f32 logits [N, chunk] of chunk c and which of its entries are its own (the last chunk
    is the vocabulary's tail: entries the chunk before holds are not its own)."""
    vocab = weight.shape[0]
    start = jnp.minimum(c * chunk, vocab - chunk)
    w_chunk = jax.lax.dynamic_slice_in_dim(weight, start, chunk)
    logits = jnp.einsum("nd,vd->nv", hidden, w_chunk, preferred_element_type=jnp.float32)
    ids = start + jnp.arange(chunk)
    return logits, ids, ids >= c * chunk, w_chunk


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def chunked_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk: int):
    """(log p(targets), entropy), both f32 [N], for hidden [N, d] and head weight [V, d] (in
    the compute dtype), visiting the vocabulary `chunk` entries at a time."""
    return _forward(hidden, weight, targets, chunk)[0]


def _forward(hidden, weight, targets, chunk):
    chunk, count = _layout(weight.shape[0], chunk)
    n = hidden.shape[0]

    def visit(carry, c):
        top, total, weighted, picked = carry
        logits, ids, own, _ = _chunk_logits(hidden, weight, c, chunk)
        masked = jnp.where(own[None, :], logits, _NEG_INF)
        new_top = jnp.maximum(top, jnp.max(masked, axis=1))
        rescale = jnp.exp(top - new_top)
        e = jnp.exp(masked - new_top[:, None])  # 0 where not own
        total = total * rescale + jnp.sum(e, axis=1)
        weighted = weighted * rescale + jnp.sum(e * logits, axis=1)
        hit = own[None, :] & (ids[None, :] == targets[:, None])
        picked = picked + jnp.sum(jnp.where(hit, logits, 0.0), axis=1)
        return (new_top, total, weighted, picked), None

    init = (jnp.full((n,), _NEG_INF, jnp.float32), jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.float32))
    (top, total, weighted, picked), _ = jax.lax.scan(visit, init, jnp.arange(count))
    lse = top + jnp.log(total)
    entropy = lse - weighted / total
    return (picked - lse, entropy), (hidden, weight, targets, lse, entropy)


def _backward(chunk, residuals, cotangents):
    hidden, weight, targets, lse, entropy = residuals
    g_logp, g_entropy = cotangents
    vocab = weight.shape[0]
    chunk, count = _layout(vocab, chunk)

    def visit(d_hidden, c):
        logits, ids, own, w_chunk = _chunk_logits(hidden, weight, c, chunk)
        logp = logits - lse[:, None]
        p = jnp.where(own[None, :], jnp.exp(logp), 0.0)
        target = own[None, :] & (ids[None, :] == targets[:, None])
        d_logits = (g_logp[:, None] * (jnp.where(target, 1.0, 0.0) - p)
                    - g_entropy[:, None] * p * (logp + entropy[:, None]))
        d_logits = d_logits.astype(hidden.dtype)
        d_hidden = d_hidden + jnp.einsum("nv,vd->nd", d_logits, w_chunk, preferred_element_type=jnp.float32)
        d_w = jnp.einsum("nv,nd->vd", d_logits, hidden, preferred_element_type=jnp.float32)
        return d_hidden, d_w.astype(weight.dtype)

    d_hidden, d_w = jax.lax.scan(visit, jnp.zeros(hidden.shape, jnp.float32), jnp.arange(count))
    d_w = d_w.reshape(count * chunk, -1)
    overlap = count * chunk - vocab  # the last chunk's rows that the one before holds (zero here)
    d_w = jnp.concatenate([d_w[:(count - 1) * chunk], d_w[(count - 1) * chunk + overlap:]])
    return d_hidden.astype(hidden.dtype), d_w, None


chunked_logprobs.defvjp(_forward, _backward)
