"""Adding updates to weights: stochastic rounding to bfloat16 against a float64 NumPy reference
of the neighbouring bfloat16 values, and nearest rounding as optax's."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from ragen_jax.rl import rounding


def neighbours(x: float) -> tuple[float, float]:
    """The bfloat16 values next to `x` towards zero and away from it (equal when `x` is one),
    from its binary exponent: 8 significant bits, so the spacing is 2^(exponent − 7)."""
    if x == 0:
        return 0.0, 0.0
    spacing = 2.0 ** (np.floor(np.log2(abs(x))) - 7)
    toward = np.trunc(x / spacing) * spacing
    return toward, (toward if toward == x else toward + np.sign(x) * spacing)


@pytest.mark.parametrize("x", [0.0201, -0.0201, 1.0, 3.3e-5, -7.77, 1e-30, 2.0 ** -20 * 1.3, 0.5 + 2 ** -9])
def test_stochastic_rounding_lands_on_a_neighbour_as_often_as_it_is_close(x):
    """Every draw is one of the two bfloat16 neighbours of the float32 value; the share rounded
    away from zero is the value's distance from the lower neighbour over the spacing (within 5
    binomial standard deviations of 100,000 draws); a bfloat16 value stays itself."""
    n = 100_000
    x32 = float(np.float32(x))
    got = np.asarray(rounding.round_to_bfloat16_stochastically(jnp.full((n,), x32, jnp.float32),
                                                               jax.random.key(0))).astype(np.float64)
    toward, away = neighbours(x32)
    assert set(np.unique(got)) <= {toward, away}
    if toward == away:
        assert (got == x32).all()
        return
    p = (x32 - toward) / (away - toward)
    share = (got == away).mean()
    assert abs(share - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (share, p)


def test_a_step_below_a_weights_precision_is_lost_to_nearest_and_kept_on_average_by_stochastic():
    """bfloat16 weights ~ N(0, 0.02) take a 1e-6 step: rounded to nearest, none of the weights
    above 0.01 moves; rounded stochastically, their mean change is the step (±5 standard errors)
    and a float32 leaf in the same tree is updated as optax updates it."""
    w = (0.02 * jax.random.normal(jax.random.key(1), (1_000_000,))).astype(jnp.bfloat16)
    bias = jax.random.normal(jax.random.key(2), (7,), jnp.float32)
    params = {"w": w, "bias": bias}
    updates = {"w": jnp.full(w.shape, 1e-6, jnp.float32), "bias": jnp.full((7,), 1e-3, jnp.float32)}
    big = np.abs(np.asarray(w, np.float64)) > 0.01
    nearest = rounding.apply_updates(params, updates)
    assert (np.asarray(nearest["w"]) == np.asarray(w))[big].all()
    stochastic = rounding.apply_updates(params, updates, jax.random.key(3))
    change = (np.asarray(stochastic["w"], np.float64) - np.asarray(w, np.float64))[big]
    assert stochastic["w"].dtype == jnp.bfloat16 and (change != 0).mean() > 0.005
    assert abs(change.mean() - 1e-6) < 5 * change.std() / np.sqrt(change.size), change.mean()
    want = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(np.asarray(stochastic["bias"]), np.asarray(want["bias"]))
    # without a key the update is optax's, bit for bit
    for name in params:
        np.testing.assert_array_equal(np.asarray(nearest[name]), np.asarray(want[name]))
    # the same key, the same weights
    again = rounding.apply_updates(params, updates, jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(again["w"]).view(np.uint16), np.asarray(stochastic["w"]).view(np.uint16))


def test_the_reference_neighbours_are_bfloat16_values():
    """The test's own reference: both neighbours are bfloat16 values (unchanged by a cast to
    ml_dtypes' bfloat16) and bracket the value."""
    for x in (0.0201, -7.77, 3.3e-5, 1.0):
        toward, away = neighbours(float(np.float32(x)))
        for v in (toward, away):
            assert float(np.float64(ml_dtypes.bfloat16(v))) == v
        assert abs(toward) <= abs(x) <= abs(away)
