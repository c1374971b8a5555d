"""Log-probabilities over the vocabulary in chunks (`head.chunked_logprobs`, `model.vocab_chunk`)
against a float64 NumPy log-softmax, and their hand-written gradients against autodiff of the
whole-vocabulary computation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.models.head import chunked_logprobs
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import token_logprobs


def numpy_reference(hidden, weight, targets):
    """float64 log p(target) and entropy, one position at a time."""
    logp, entropy = [], []
    for h, t in zip(np.asarray(hidden, np.float64), np.asarray(targets)):
        logits = np.asarray(weight, np.float64) @ h
        shifted = logits - logits.max()
        log_probs = shifted - np.log(np.exp(shifted).sum())
        logp.append(log_probs[t])
        entropy.append(-(np.exp(log_probs) * log_probs).sum())
    return np.array(logp), np.array(entropy)


def whole_vocabulary(hidden, weight, targets):
    logp = jax.nn.log_softmax(jnp.einsum("nd,vd->nv", hidden, weight, preferred_element_type=jnp.float32))
    return jnp.take_along_axis(logp, targets[:, None], 1)[:, 0], -jnp.sum(jnp.exp(logp) * logp, axis=1)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 40), st.integers(2, 300), st.integers(1, 64), st.integers(0, 12), st.integers(0, 2**31 - 1))
def test_values_equal_a_float64_log_softmax(n, vocab, chunk, rows, seed):
    """Any chunk size, dividing the vocabulary or not (the last chunk's entries shared with the
    chunk before counted once), any block of positions (0: all at once)."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(n, 8)).astype(np.float32)
    weight = (rng.normal(size=(vocab, 8)) * 2).astype(np.float32)
    targets = rng.integers(0, vocab, n).astype(np.int32)
    logp, entropy = chunked_logprobs(jnp.asarray(hidden), jnp.asarray(weight), jnp.asarray(targets), chunk, rows)
    want_logp, want_entropy = numpy_reference(hidden, weight, targets)
    np.testing.assert_allclose(np.asarray(logp), want_logp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(entropy), want_entropy, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk, rows", [(50, 0), (64, 7), (200, 23)])
def test_gradients_equal_autodiff_of_the_whole_vocabulary(chunk, rows):
    rng = np.random.default_rng(chunk)
    n, d, vocab = 23, 12, 200
    hidden = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, d)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, n), jnp.int32)
    g_logp, g_entropy = (jnp.asarray(rng.normal(size=n), jnp.float32) for _ in range(2))

    def loss(fn):
        return lambda h, w: jnp.sum(fn(h, w)[0] * g_logp + fn(h, w)[1] * g_entropy)

    got = jax.grad(loss(lambda h, w: chunked_logprobs(h, w, targets, chunk, rows)), argnums=(0, 1))(hidden, weight)
    want = jax.grad(loss(lambda h, w: whole_vocabulary(h, w, targets)), argnums=(0, 1))(hidden, weight)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
        assert float(jnp.abs(b).max()) > 1e-3


def test_token_logprobs_with_a_vocabulary_chunk_equal_the_whole_vocabulary():
    """The model's loss path: log-probs, entropies and their gradients with respect to every
    parameter (the tied head included) agree with `vocab_chunk` 0."""
    from flax import nnx

    cfg = DecoderConfig.preset("tiny")
    model = init_model(cfg, jax.random.key(0))
    chunked = init_model(dataclasses.replace(cfg, vocab_chunk=300), jax.random.key(0))
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(3, 150, cfg.hidden_size)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 150)), jnp.int32)

    def loss(m):
        logp, entropy = token_logprobs(m, hidden, targets, with_entropy=True)
        return jnp.mean(logp) + 0.1 * jnp.mean(entropy), (logp, entropy)

    (_, want), g_want = nnx.value_and_grad(loss, has_aux=True)(model)
    (_, got), g_got = nnx.value_and_grad(loss, has_aux=True)(chunked)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_the_gradient_keeps_no_per_chunk_logits():
    """Differentiated under a loop (as a scan over micro-batches would be), the program holds
    no [chunks, positions, chunk] array — what autodiff of the forward's vocabulary loop keeps
    (masks or logits per chunk)."""
    cfg = DecoderConfig.preset("tiny", vocab_chunk=300)
    from flax import nnx

    graph, params = nnx.split(init_model(cfg, jax.random.key(0)))
    hidden = jnp.ones((3, 2, 150, cfg.hidden_size))
    targets = jnp.zeros((3, 2, 150), jnp.int32)

    def loss(p):
        model = nnx.merge(graph, p)
        out = jax.lax.map(lambda a: token_logprobs(model, a[0], a[1], with_entropy=True), (hidden, targets))
        return sum(x.sum() for x in out)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
    shapes = [v.aval.shape for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "shape")]
    assert any(s[-1:] == (300,) for s in shapes)  # the chunks are there
    assert not any(len(s) == 3 and s[0] == 4 and s[1] > 1 and s[2] == 300 for s in shapes), shapes


def test_negative_vocab_chunk_is_refused():
    with pytest.raises(ValueError, match="vocab_chunk=-1 must be >= 0"):
        DecoderConfig.preset("tiny", vocab_chunk=-1)
