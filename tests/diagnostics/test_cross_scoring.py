"""Prefix-shared cross-scoring equals naive full-sequence scoring of every pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.diagnostics.cross_scoring import cross_score, reasoning_mi
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import token_logprobs

N, P, M, Z = 3, 7, 5, 6


@pytest.fixture(scope="module")
def model():
    return init_model(DecoderConfig.preset("tiny"), jax.random.key(0))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, 1000, (N, P))
    prompt_mask = np.ones((N, P), bool)
    prompt_mask[1, :2] = False  # left padding
    prompt_mask[2, 3] = False  # a hole
    reasoning = rng.integers(3, 1000, (M, Z))
    reasoning_mask = np.ones((M, Z), bool)
    reasoning_mask[1, 3:] = False
    reasoning_mask[2, 1:] = False  # one token
    reasoning_mask[3, :] = False  # empty reasoning
    return prompts, prompt_mask, reasoning, reasoning_mask


def naive_sum(model, prompt, reasoning):
    """One full forward over the compacted [x | z]; log-probs of the z tokens."""
    sequence = jnp.asarray(np.concatenate([prompt, reasoning]))[None]
    return float(_forward_sum(model, sequence, jnp.asarray(reasoning)[None]))


@nnx.jit
def _forward_sum(model, sequence, reasoning):
    mask = jnp.ones_like(sequence, bool)
    hidden, _ = model(sequence, positions_from_mask(mask), mask)
    return token_logprobs(model, hidden[:, sequence.shape[1] - reasoning.shape[1] - 1 : -1], reasoning).sum()


def test_prefix_shared_equals_naive(model, batch):
    prompts, prompt_mask, reasoning, reasoning_mask = batch
    L, Ls = jax.jit(cross_score)(model, *(jnp.asarray(a) for a in batch))
    for i in range(M):
        z = reasoning[i][reasoning_mask[i]]
        for j in range(N):
            if len(z) == 0:
                assert float(Ls[i, j]) == 0.0 and float(L[i, j]) == 0.0
                continue
            want = naive_sum(model, prompts[j][prompt_mask[j]], z)
            np.testing.assert_allclose(float(Ls[i, j]), want, atol=1e-4, rtol=1e-5)
            np.testing.assert_allclose(float(L[i, j]), want / len(z), atol=1e-5, rtol=1e-5)


def test_reasoning_mi_end_to_end(model, batch):
    prompts, prompt_mask, reasoning, reasoning_mask = batch
    true_column = jnp.array([0, 1, 2, 0, 1])
    metrics, ema = jax.jit(reasoning_mi)(model, *(jnp.asarray(a) for a in batch), true_column)
    np.testing.assert_allclose(float(metrics["valid_thinking_rate"]), 0.8, rtol=1e-6)
    assert bool(ema.initialised)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert float(metrics["mi_estimate"]) <= np.log(N) + 1e-6
