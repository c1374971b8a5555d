"""Log-probabilities and entropies of the LM head over the vocabulary in chunks.

For a 152K vocabulary the f32 logits of a few thousand positions are gigabytes; the loss only
needs, per position, the target's log-probability and the distribution's entropy. Here the
vocabulary is visited `chunk` entries at a time with a running maximum (an online
log-sum-exp), so at most [positions, chunk] logits exist. The gradient is written by hand
(`jax.custom_vjp`) and visits the chunks again, recomputing each chunk's logits: autodiff of
the forward loop would keep every chunk's logits for the backward pass, the whole vocabulary
again. With l = h·Wᵀ, p = softmax(l), H = −Σ p log p:

    ∂ log p_t / ∂ l_v = [v = t] − p_v          ∂H / ∂ l_v = −p_v (log p_v + H)

Padding entries (the vocabulary rounded up to a whole number of chunks) get −∞ logits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def _chunks(weight: jax.Array, chunk: int) -> jax.Array:
    """weight [V, d] -> [C, chunk, d], zero rows past V."""
    v, d = weight.shape
    pad = (-v) % chunk
    return jnp.pad(weight, ((0, pad), (0, 0))).reshape(-1, chunk, d)


def _chunk_logits(hidden, w_chunk, c, chunk, vocab):
    """f32 logits [N, chunk] of chunk c, padding entries at −∞."""
    logits = jnp.einsum("nd,vd->nv", hidden, w_chunk, preferred_element_type=jnp.float32)
    ids = c * chunk + jnp.arange(chunk)
    return jnp.where(ids[None, :] < vocab, logits, _NEG_INF), ids


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def chunked_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk: int):
    """(log p(targets), entropy), both f32 [N], for hidden [N, d] and head weight [V, d] (in
    the compute dtype), visiting the vocabulary `chunk` entries at a time."""
    return _forward(hidden, weight, targets, chunk)[0]


def _forward(hidden, weight, targets, chunk):
    vocab = weight.shape[0]
    n = hidden.shape[0]

    def visit(carry, xs):
        top, total, weighted, picked = carry
        w_chunk, c = xs
        logits, ids = _chunk_logits(hidden, w_chunk, c, chunk, vocab)
        new_top = jnp.maximum(top, jnp.max(logits, axis=1))
        rescale = jnp.exp(top - new_top)
        e = jnp.exp(logits - new_top[:, None])
        finite = jnp.where(ids[None, :] < vocab, logits, 0.0)
        total = total * rescale + jnp.sum(e, axis=1)
        weighted = weighted * rescale + jnp.sum(e * finite, axis=1)
        picked = picked + jnp.sum(jnp.where(ids[None, :] == targets[:, None], logits, 0.0), axis=1)
        return (new_top, total, weighted, picked), None

    init = (jnp.full((n,), _NEG_INF, jnp.float32), jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.float32))
    w = _chunks(weight, chunk)
    (top, total, weighted, picked), _ = jax.lax.scan(visit, init, (w, jnp.arange(w.shape[0])))
    lse = top + jnp.log(total)
    entropy = lse - weighted / total
    return (picked - lse, entropy), (hidden, weight, targets, lse, entropy)


def _backward(chunk, residuals, cotangents):
    hidden, weight, targets, lse, entropy = residuals
    g_logp, g_entropy = cotangents
    vocab = weight.shape[0]

    def visit(d_hidden, xs):
        w_chunk, c = xs
        logits, ids = _chunk_logits(hidden, w_chunk, c, chunk, vocab)
        logp = logits - lse[:, None]
        p = jnp.exp(logp)  # 0 on padding entries
        logp = jnp.where(ids[None, :] < vocab, logp, 0.0)
        d_logits = (g_logp[:, None] * (jnp.where(ids[None, :] == targets[:, None], 1.0, 0.0) - p)
                    - g_entropy[:, None] * p * (logp + entropy[:, None]))
        d_logits = d_logits.astype(hidden.dtype)
        d_hidden = d_hidden + jnp.einsum("nv,vd->nd", d_logits, w_chunk, preferred_element_type=jnp.float32)
        d_w = jnp.einsum("nv,nd->vd", d_logits, hidden, preferred_element_type=jnp.float32)
        return d_hidden, d_w.astype(weight.dtype)

    w = _chunks(weight, chunk)
    d_hidden, d_w = jax.lax.scan(visit, jnp.zeros(hidden.shape, jnp.float32), (w, jnp.arange(w.shape[0])))
    d_w = d_w.reshape(-1, weight.shape[1])[:vocab]
    return d_hidden.astype(hidden.dtype), d_w, None


chunked_logprobs.defvjp(_forward, _backward)
