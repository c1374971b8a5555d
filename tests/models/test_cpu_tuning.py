"""CPU tuning of the forward: where it applies, row-chunked prefills and the fused q/k/v projection
against transformers and the one-piece forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.models import cpu_tuning, hf, sampling
from ragen_jax.models.cache import DecodeContext, init_cache, positions_from_mask

from hf_reference import VOCAB, hf_logits

TOL = 1e-4


@pytest.fixture(scope="module")
def untied(hf_models):
    torch_model, path = hf_models["untied"]
    return torch_model, hf.load_pretrained(path)


def ours_logits(model, ids, mask, context=DecodeContext()):
    mask = jnp.asarray(mask)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(mask), mask, context)
    return np.asarray(model.logits(hidden))


def test_row_chunks_apply_per_device_inside_a_shard_map_only():
    """With several devices, row chunks apply inside a shard_map over every mesh axis (each
    device runs its own rows, no collectives) and not in a jit over an automatic mesh."""
    from jax.sharding import PartitionSpec

    from ragen_jax.core import sharding

    mesh = sharding.make_mesh((2, 1, 1))
    seen = []

    def record(x):
        seen.append(cpu_tuning.on_cpu_per_device())
        return x

    jax.eval_shape(jax.shard_map(record, mesh=mesh, in_specs=PartitionSpec("data"),
                                 out_specs=PartitionSpec("data")), jnp.zeros(4))
    with jax.set_mesh(mesh):
        jax.eval_shape(jax.jit(record), jnp.zeros(4))
    assert seen == [True, False] and not cpu_tuning.on_cpu_per_device()


def test_prefill_in_row_chunks_keeps_cache_and_logits(untied, monkeypatch):
    """Filling a KV cache on one CPU device runs the MLP and each attention block in row chunks
    (`cpu_tuning.in_row_chunks`) when their activations exceed CHUNK_FLOATS; forced here on 5
    sequences with padding and holes (MLP chunks of 14 rows, attention chunks of 2 sequences,
    each with a padded last chunk): transformers' next-token logits, and the one-piece
    prefill's cache."""
    torch_model, model = untied
    rng = np.random.default_rng(3)
    ids = rng.integers(3, VOCAB, size=(5, 11)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 8:] = False
    mask[2, :3] = False
    mask[4, [2, 5]] = False

    def prefill():  # a new function each time: traced afresh with the current CHUNK_FLOATS
        run = jax.jit(lambda m, c, t, k: sampling.prefill(m, c, t, k, 0))
        return run(model, init_cache(model.cfg, 5, 16), jnp.asarray(ids), jnp.asarray(mask))

    whole_cache, whole_logits = prefill()
    scores_per_row = model.cfg.num_heads * 11 * 11
    monkeypatch.setattr(cpu_tuning, "CHUNK_FLOATS", 2 * scores_per_row)
    monkeypatch.setattr(cpu_tuning, "on_cpu_per_device", lambda: True)  # the suite has 8 fake devices
    assert cpu_tuning.row_chunk(ids.size, model.cfg.intermediate_size, minimum=16) == 14
    assert cpu_tuning.row_chunk(5, scores_per_row) == 2
    assert cpu_tuning.row_chunk(2, scores_per_row) == 2  # small inputs stay whole
    cache, logits = prefill()
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    last = np.array([np.flatnonzero(row).max() for row in mask])
    ref = hf_logits(torch_model, ids, mask, positions)[np.arange(5), last]
    assert np.abs(np.asarray(logits) - ref).max() <= 1e-4
    np.testing.assert_allclose(np.asarray(logits), np.asarray(whole_logits), atol=1e-5)
    for a, b in ((cache.k, whole_cache.k), (cache.v, whole_cache.v)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_fused_qkv_matches_transformers_and_the_separate_projections(hf_models, llama_models, batch, monkeypatch,
                                                                     family):
    """The q/k/v projections as one matmul (`fused_qkv`, on one CPU device) give transformers'
    logits, and the separate projections' within float rounding, with every slot as a query and
    with one query slot per row (the prefill's last layer), with q/k/v biases (Qwen2) and without
    (Llama); elsewhere (this suite runs 8 fake devices) there are none."""
    torch_model, path = (hf_models if family == "qwen2" else llama_models)["untied"]
    model = hf.load_pretrained(path)
    ids, mask = batch
    assert cpu_tuning.fused_qkv(model) is None
    monkeypatch.setattr(cpu_tuning, "on_cpu_per_device", lambda: True)
    fused = cpu_tuning.fused_qkv(model)
    assert len(fused) == model.cfg.num_layers
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = hf_logits(torch_model, ids, mask, positions)
    got = ours_logits(model, ids, mask, DecodeContext(fused_qkv=fused))
    assert np.abs(got - ref)[mask].max() <= TOL
    np.testing.assert_allclose(got, ours_logits(model, ids, mask), atol=1e-5)
    last = jnp.asarray([np.flatnonzero(row).max() for row in mask])
    picked = ours_logits(model, ids, mask, DecodeContext(fused_qkv=fused, query=last))
    np.testing.assert_allclose(picked[:, 0], got[np.arange(len(ids)), np.asarray(last)], atol=1e-5)
