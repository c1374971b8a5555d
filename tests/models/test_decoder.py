"""Our Qwen2 against transformers' Qwen2ForCausalLM: logits, holes, log-probs, RoPE variants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import hf
from ragen_jax.models.cache import DecodeContext, positions_from_mask
from ragen_jax.models.config import PRESETS, DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import logprobs_at
from ragen_jax.models.rope import rope_frequencies

from hf_reference import VOCAB, hf_logits, long_batch, make_hf_model

TOL = 1e-4


def ours_logits(model, ids, mask, query_block=None):
    """Our logits [B, T, V], jitted (one compile per shape instead of one per eager op)."""
    graph, state = nnx.split(model)
    return np.asarray(_logits(graph, query_block, state, jnp.asarray(ids), jnp.asarray(mask)))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _logits(graph, query_block, state, ids, mask):
    model = nnx.merge(graph, state)
    context = DecodeContext() if query_block is None else DecodeContext(query_block=query_block)
    hidden, _ = model(ids, positions_from_mask(mask), mask, context)
    return model.logits(hidden)


@pytest.mark.parametrize("name", ["tied", "untied", "theta"])
def test_logits_match_transformers(hf_models, batch, name):
    torch_model, path = hf_models[name]
    model = hf.load_pretrained(path)
    ids, mask = batch
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = hf_logits(torch_model, ids, mask, positions)
    got = ours_logits(model, ids, mask)
    assert np.abs(got - ref)[mask].max() <= TOL
    assert model.cfg.tie_word_embeddings == (name != "untied")
    if name == "theta":
        assert model.cfg.rope_theta == 123.0


@pytest.mark.parametrize("query_block", [128, 32])
def test_long_inputs_attended_in_query_blocks_match_transformers(hf_models, query_block):
    """Past `query_block` slots (ATTENTION_BLOCK by default, PREFILL_BLOCK in `generate`), each
    block of queries reads only the keys up to its own last slot; the logits must still be
    transformers' (padding at both ends and a hole inside)."""
    from ragen_jax.models.config import ATTENTION_BLOCK, PREFILL_BLOCK

    assert (ATTENTION_BLOCK, PREFILL_BLOCK) == (128, 32)  # the parametrisation covers both

    torch_model, path = hf_models["untied"]
    model = hf.load_pretrained(path)
    ids, mask = long_batch(2 * ATTENTION_BLOCK + 45)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = hf_logits(torch_model, ids, mask, positions)
    got = ours_logits(model, ids, mask, query_block)
    assert np.abs(got - ref)[mask].max() <= TOL


def test_holes_equal_compacted_sequence(hf_models):
    model = hf.load_pretrained(hf_models["untied"][1])
    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, size=(2, 16)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[0, [3, 4, 5, 10, 15]] = False
    mask[1, [0, 7, 8]] = False
    got = ours_logits(model, ids, mask)
    for b in range(2):
        compact = ids[b][mask[b]][None]
        ref = ours_logits(model, compact, np.ones_like(compact, dtype=bool))[0]
        np.testing.assert_allclose(got[b][mask[b]], ref, atol=TOL)
        # and the compacted sequence matches transformers
        torch_ref = hf_logits(hf_models["untied"][0], compact, np.ones_like(compact))[0]
        np.testing.assert_allclose(ref, torch_ref, atol=TOL)


def test_logprobs_at_requested_positions(hf_models, batch):
    torch_model, path = hf_models["tied"]
    model = hf.load_pretrained(path)
    ids, mask = batch
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = hf_logits(torch_model, ids, mask, positions)
    ref_logp = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
    query = np.array([[0, 3, 7, 11, 2], [1, 2, 3, 4, 8], [4, 5, 6, 12, 9], [0, 1, 2, 3, 4]], np.int32)
    targets = np.random.default_rng(2).integers(0, VOCAB, size=query.shape).astype(np.int32)
    mask_j = jnp.asarray(mask)
    logp, ent = logprobs_at(model, jnp.asarray(ids), positions_from_mask(mask_j), mask_j,
                            jnp.asarray(query), jnp.asarray(targets), chunk_size=2, with_entropy=True)
    want = np.take_along_axis(np.take_along_axis(ref_logp, query[..., None], 1), targets[..., None], 2)[..., 0]
    probs = np.exp(np.take_along_axis(ref_logp, query[..., None], 1))
    want_ent = -(probs * np.take_along_axis(ref_logp, query[..., None], 1)).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), want, atol=TOL)
    np.testing.assert_allclose(np.asarray(ent), want_ent, atol=TOL)


def test_remat_keeps_values_and_gradients(hf_models, batch):
    model = hf.load_pretrained(hf_models["tied"][1])
    remat = hf.load_pretrained(hf_models["tied"][1], remat=True)
    ids, mask = (jnp.asarray(x) for x in batch)
    pos = positions_from_mask(mask)

    def loss(m):
        hidden, _ = m(ids, pos, mask)
        return jnp.mean(m.logits(hidden)[..., 5] * mask)

    g1 = nnx.grad(loss)(model)
    g2 = nnx.grad(loss)(remat)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert float(jnp.abs(jax.tree.leaves(g1)[0]).max()) > 0


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "rope_theta": 5000.0, "factor": 3.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
])
def test_rope_scaling_matches_transformers(tmp_path, rope):
    torch_model = make_hf_model(tie=True, rope=dict(rope), seed=3, max_position_embeddings=256)
    torch_model.save_pretrained(tmp_path)
    model = hf.load_pretrained(tmp_path)
    inv_freq = torch_model.model.rotary_emb.inv_freq.numpy()
    ours, scale = rope_frequencies(model.cfg)
    np.testing.assert_allclose(ours, inv_freq, rtol=1e-6)
    assert scale == pytest.approx(torch_model.model.rotary_emb.attention_scaling)
    ids = np.random.default_rng(4).integers(1, VOCAB, size=(1, 40)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    np.testing.assert_allclose(ours_logits(model, ids, mask), hf_logits(torch_model, ids, mask), atol=TOL)


def test_presets_have_expected_sizes():
    assert 0.4e6 <= PRESETS["tiny"].num_params() <= 0.6e6
    assert 3.5e6 <= PRESETS["small"].num_params() <= 4.5e6
    assert abs(PRESETS["qwen2.5-0.5b"].num_params() - 494_032_768) < 1e6  # Qwen2.5-0.5B card: 0.49B
    assert PRESETS["qwen2.5-7b"].tie_word_embeddings is False
    model = init_model(DecoderConfig.preset("tiny"), jax.random.key(0))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert count == PRESETS["tiny"].num_params()
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        DecoderConfig.preset("huge")


def test_bf16_compute_is_close_to_f32(hf_models, batch):
    path = hf_models["tied"][1]
    f32 = ours_logits(hf.load_pretrained(path), *batch)
    bf16 = ours_logits(hf.load_pretrained(path, dtype="bfloat16", param_dtype="bfloat16"), *batch)
    assert np.abs(f32 - bf16)[batch[1]].max() < 0.1


def test_the_inference_copy_gives_the_same_numbers(hf_models, batch):
    """`for_inference` (what the rollout, diagnostics and validation run on): weights stored in
    bfloat16 once instead of cast at every use — bitwise the same logits; float32 compute keeps
    the weights as they are; under a mesh that splits the model the embedding/head is whole on
    every device and the rest stays split."""
    from ragen_jax.models.stacking import for_inference
    from ragen_jax.core import sharding

    model = hf.load_pretrained(hf_models["tied"][1], dtype="bfloat16")
    cast = for_inference(model)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(cast))} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(jnp.float32)}
    np.testing.assert_array_equal(ours_logits(cast, *batch), ours_logits(model, *batch))
    f32 = hf.load_pretrained(hf_models["tied"][1])
    for a, b in zip(jax.tree.leaves(nnx.state(for_inference(f32))), jax.tree.leaves(nnx.state(f32))):
        assert a is b

    mesh = sharding.make_mesh((1, 4, 2), jax.devices()[:8])
    sharded = hf.load_pretrained(hf_models["untied"][1], mesh)
    graph, state = nnx.split(sharded)

    def placements(state):
        m = for_inference(nnx.merge(graph, state))
        return m.lm_head[...] * 1, m.layers[0].mlp.up_proj.kernel[...] * 1

    with sharding.tracing_on(mesh):
        head, kernel = jax.jit(placements)(state)
    assert head.sharding.is_fully_replicated and not kernel.sharding.is_fully_replicated
