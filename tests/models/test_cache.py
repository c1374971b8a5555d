"""The KV caches: the stacked cache's two storage layouts against NumPy and against each other
through the programs that read them, the per-layer copy a decode loop works on against the
stacked cache."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.models import sampling
from ragen_jax.models.cache import PerLayerKVCache, init_cache, stores_heads_minor
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model

LAYOUTS = ("heads_major", "heads_minor")


def two_kv_heads(layout: str, **overrides) -> DecoderConfig:
    """The tiny model's shapes with two KV heads (one would hide an ordering of the heads)."""
    return dataclasses.replace(DecoderConfig.preset("tiny"), num_heads=4, num_kv_heads=2, head_dim=8,
                               kv_layout=layout, **overrides)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stacked_cache_stores_each_layout_and_reads_back_the_attentions(layout):
    """`write` of keys [B, kv_heads, T, head_dim] at slot 3 puts key[b, h, t, d] at
    storage[layer, b, h, 3 + t, d] (heads_major) or storage[layer, b, 3 + t, h * head_dim + d]
    (heads_minor), NumPy indexing as the reference; `read` gives the slots before `end` back
    as [B, kv_heads, end, head_dim], the unwritten ones zero."""
    cfg = two_kv_heads(layout)
    b, kvh, hd, t = 2, cfg.num_kv_heads, cfg.head_dim, 4
    cache = init_cache(cfg, b, 10, dtype=jnp.float32)
    minor = layout == "heads_minor"
    assert cache.heads_minor == minor and cache.kv_heads == kvh
    assert cache.k.shape == ((cfg.num_layers, b, 10, kvh * hd) if minor else (cfg.num_layers, b, kvh, 10, hd))
    keys, values = (np.asarray(jax.random.normal(jax.random.key(s), (b, kvh, t, hd))) for s in (2, 3))
    cache = cache.write(1, jnp.asarray(keys), jnp.asarray(values), 3)
    want_k = np.zeros(cache.k.shape, np.float32)
    for row in range(b):
        for head in range(kvh):
            for slot in range(t):
                if minor:
                    want_k[1, row, 3 + slot, head * hd:(head + 1) * hd] = keys[row, head, slot]
                else:
                    want_k[1, row, head, 3 + slot] = keys[row, head, slot]
    np.testing.assert_array_equal(np.asarray(cache.k), want_k)
    read_k, read_v = cache.read(1, 8)
    assert read_k.shape == (b, kvh, 8, hd)
    np.testing.assert_array_equal(np.asarray(read_k)[:, :, 3:7], keys)
    np.testing.assert_array_equal(np.asarray(read_v)[:, :, 3:7], values)
    assert not np.asarray(read_k)[:, :, :3].any() and not np.asarray(read_k)[:, :, 7:].any()


def test_auto_layout_is_heads_minor_on_a_tpu_backend_only(monkeypatch):
    assert not stores_heads_minor(two_kv_heads("auto"))  # the suite runs on CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert stores_heads_minor(two_kv_heads("auto")) and not stores_heads_minor(two_kv_heads("heads_major"))
    with pytest.raises(ValueError, match="kv_layout='rows'.*allowed: auto, heads_major, heads_minor"):
        two_kv_heads("rows")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_layer_cache_round_trips_through_the_stacked_one(layout):
    """`from_stacked` then `merge_into` writes the same keys, values and mask back, and the
    per-layer keys are the stacked ones read in the attention's layout, transposed, with batch
    and kv heads merged."""
    cfg = two_kv_heads(layout)
    stacked = init_cache(cfg, 2, 8)
    keys, values = (jax.random.normal(jax.random.key(seed), stacked.k.shape) for seed in (0, 1))
    stacked = stacked.replace(k=keys, v=values, mask=jnp.arange(16).reshape(2, 8) % 3 > 0)
    layered = PerLayerKVCache.from_stacked(stacked, 5)
    assert layered.length == 5 and not layered.shared
    b, kvh, hd = 2, cfg.num_kv_heads, cfg.head_dim
    read_k, read_v = stacked.read(1, 5)
    np.testing.assert_array_equal(layered.k[1], read_k.reshape(b * kvh, 5, hd).transpose(0, 2, 1))
    np.testing.assert_array_equal(layered.v[1], read_v.reshape(b * kvh, 5, hd))
    back = layered.merge_into(stacked)
    for a, want in zip(jax.tree.leaves(back), jax.tree.leaves(stacked)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(want))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_heads_minor_decodes_and_scores_buffers_as_heads_major(scan_layers):
    """The same weights with either layout: a prefill at slot 0, a chunk behind a gap, decoding
    with a key limit (the stacked cache read every step when the layers are scanned), and the
    diagnostics' scoring of continuations behind other rows' cached prompts (gathered, padded
    and shared columns) give the same tokens and log-probs."""
    from ragen_jax.diagnostics import buffer_scoring

    rng = np.random.default_rng(3)
    b, p, gap, new = 3, 9, 4, 6
    prompt = jnp.asarray(rng.integers(3, 1000, (b, p)), jnp.int32)
    prompt_mask = jnp.asarray(rng.random((b, p)) > 0.2).at[:, -1].set(True)
    columns, ends = jnp.array([[0, 1], [2, 0], [1, 2]]), jnp.array([[9, 7], [8, 9], [5, 9]])
    cont = jnp.asarray(rng.integers(3, 1000, (b, 4)), jnp.int32)
    cont_mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
    results = {}
    for layout in LAYOUTS:
        model = init_model(two_kv_heads(layout, scan_layers=scan_layers), jax.random.key(0))
        cache = init_cache(model.cfg, b, p + gap + new + 2)
        cache, first = sampling.prefill(model, cache, prompt, prompt_mask, 0)
        cache, out = sampling.decode(model, cache, first, p + gap, jax.random.key(1), num_steps=new,
                                     params=sampling.SamplingParams(temperature=1.0), key_limit=p + gap + new)
        buffers = buffer_scoring.prefill_buffers(model, prompt, prompt_mask)
        scored = [buffer_scoring.score_continuations(model, buffers, prompt, p, columns, ends, cont, cont_mask,
                                                     shared_columns=shared)[0] for shared in (False, True)]
        results[layout] = (out.tokens, out.logprobs, *scored)
    major, minor = results["heads_major"], results["heads_minor"]
    np.testing.assert_array_equal(np.asarray(minor[0]), np.asarray(major[0]))
    for a, want in zip(minor[1:], major[1:]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(want), atol=1e-5)
