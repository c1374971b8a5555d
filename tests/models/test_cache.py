"""The KV caches: the per-layer copy a decode loop works on against the stacked cache."""

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models.cache import PerLayerKVCache, init_cache


def test_per_layer_cache_round_trips_through_the_stacked_one():
    """`from_stacked` then `merge_into` writes the same keys, values and mask back, and the
    per-layer keys are the stacked ones transposed with batch and kv heads merged."""
    from ragen_jax.models.config import DecoderConfig

    cfg = DecoderConfig.preset("tiny")
    stacked = init_cache(cfg, 2, 8)
    shape = stacked.k.shape
    keys, values = (jax.random.normal(jax.random.key(seed), shape) for seed in (0, 1))
    stacked = stacked.replace(k=keys, v=values, mask=jnp.arange(16).reshape(2, 8) % 3 > 0)
    layered = PerLayerKVCache.from_stacked(stacked, 5)
    assert layered.length == 5 and not layered.shared
    layers, b, kvh, _, hd = shape
    np.testing.assert_array_equal(layered.k[1], stacked.k[1, :, :, :5].reshape(b * kvh, 5, hd).transpose(0, 2, 1))
    back = layered.merge_into(stacked)
    for a, want in zip(jax.tree.leaves(back), jax.tree.leaves(stacked)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(want))
