"""`model.attention`: jax.nn.dot_product_attention's XLA path against transformers and against
our einsum path (values, gradients, cached decoding); cuDNN refused off a GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import hf, sampling
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import logprobs_at

from hf_reference import VOCAB, hf_logits, long_batch


def test_xla_attention_matches_transformers(hf_models):
    torch_model, path = hf_models["untied"]
    model = hf.load_pretrained(path, attention="xla")
    ids, mask = long_batch()
    forward = nnx.jit(lambda m, ids, mask: m.logits(m(ids, positions_from_mask(mask), mask)[0]))
    got = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    ref = hf_logits(torch_model, ids, mask, np.maximum(np.cumsum(mask, -1) - 1, 0))
    assert np.abs(got - ref)[mask].max() <= 1e-4


@pytest.mark.parametrize("remat", [False, True])
def test_xla_attention_gives_the_einsum_paths_loss_and_gradients(remat):
    ids, mask = (jnp.asarray(a) for a in long_batch(160))
    positions = positions_from_mask(mask)
    targets = jnp.roll(ids, -1, axis=1)

    def loss_and_grads(attention):
        cfg = DecoderConfig.preset("tiny", attention=attention, remat=remat)
        model = init_model(cfg, jax.random.key(0))

        def loss(m):
            logp = logprobs_at(m, ids, positions, mask, jnp.broadcast_to(jnp.arange(159), (2, 159)), targets[:, :159])
            return -(logp * (mask[:, :-1] & mask[:, 1:])).sum()  # valid slots predicting valid tokens

        value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
        return float(value), jax.tree.leaves(nnx.to_pure_dict(grads))

    (ours, ours_grads), (xla, xla_grads) = loss_and_grads("einsum"), loss_and_grads("xla")
    np.testing.assert_allclose(xla, ours, rtol=1e-5)
    for got, want in zip(xla_grads, ours_grads):
        # float32 sums in another order (the two paths jitted apart): entries near 0 differ by ~2e-6
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=5e-6)


def test_greedy_decoding_with_xla_attention_matches_transformers(hf_models):
    from test_sampling import NEW, hf_generate

    torch_model, path = hf_models["untied"]
    model = hf.load_pretrained(path, attention="xla")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, VOCAB, size=(3, 45)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :20] = False
    ids[~mask] = 0
    out = sampling.generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), max_new_tokens=NEW,
                            params=sampling.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), hf_generate(torch_model, ids, mask))


def test_unknown_attention_and_cudnn_off_a_gpu_are_refused():
    from ragen_jax.run.config import ConfigError
    from ragen_jax.run.experiment import load_model
    from ragen_jax.run.schema import ModelSection

    with pytest.raises(ValueError, match="attention='flash' is not supported; allowed: einsum, xla, cudnn"):
        DecoderConfig.preset("tiny", attention="flash")
    with pytest.raises(ValueError, match="model.attention='flash' is not supported"):
        ModelSection(attention="flash")
    if jax.default_backend() != "gpu":
        with pytest.raises(ConfigError, match="model.attention='cudnn' needs an NVIDIA GPU"):
            load_model(ModelSection(attention="cudnn"), 0, None)
    assert dataclasses.replace(DecoderConfig.preset("tiny"), attention="xla").attention == "xla"
