"""FrozenLake's maps: generated maps are solvable and reproducible, the flood fill, the parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.envs.frozenlake import FROZENLAKE, FrozenLakeParams, reachable
from ragen_jax.envs.solver import solve_frozenlake

DESC_4X4 = tuple(MAPS["4x4"])


@pytest.mark.parametrize("size,p", [(4, 0.8), (8, 0.8), (6, 0.5)])
def test_generated_maps_are_always_solvable(size, p):
    params = FrozenLakeParams(size=size, p=p)
    states = jax.jit(FROZENLAKE.reset_batch, static_argnums=1)(jax.random.split(jax.random.key(size), 400), params)
    holes, start, goal = (np.asarray(a) for a in (states.holes, states.start, states.goal))
    distinct = {(h.tobytes(), tuple(s), tuple(g)) for h, s, g in zip(holes, start, goal)}
    assert len(distinct) >= 0.95 * 400
    for h, s, g in zip(holes, start, goal):
        assert tuple(s) != tuple(g) and not h[tuple(s)] and not h[tuple(g)]
        assert solve_frozenlake(h, s, g) is not None
    # Holes appear at about the rate asked for (fewer: unsolvable maps are redrawn).
    assert 0.5 * (1 - p) < holes.mean() <= 1 - p + 0.02


def test_low_p_forces_retries_and_stays_deterministic():
    params = FrozenLakeParams(size=5, p=0.4)
    keys = jax.random.split(jax.random.key(3), 64)
    a = jax.jit(FROZENLAKE.reset_batch, static_argnums=1)(keys, params)
    b = jax.jit(jax.vmap(FROZENLAKE.reset, in_axes=(0, None)), static_argnums=1)(keys, params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    for h, s, g in zip(np.asarray(a.holes), np.asarray(a.start), np.asarray(a.goal)):
        assert solve_frozenlake(h, s, g) is not None


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7), st.integers(0, 2**31 - 1), st.floats(0.1, 0.9))
def test_flood_fill_matches_bfs(size, seed, p):
    rng = np.random.default_rng(seed)
    holes = rng.random((size, size)) > p
    start = rng.integers(0, size, 2)
    holes[tuple(start)] = False
    region = np.asarray(reachable(jnp.asarray(holes), jnp.asarray(start)))
    for r in range(size):
        for c in range(size):
            if holes[r, c] or (r, c) == tuple(start):
                expected = (r, c) == tuple(start)
            else:
                expected = solve_frozenlake(holes, start, np.array([r, c])) is not None
            assert region[r, c] == expected, (r, c)


def test_same_key_same_map_and_fixed_desc():
    params = FrozenLakeParams()
    reset = jax.jit(FROZENLAKE.reset, static_argnums=1)
    a, b = reset(jax.random.key(7), params), reset(jax.random.key(7), params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    fixed = FROZENLAKE.reset(jax.random.key(1), FrozenLakeParams(desc=DESC_4X4))
    assert FROZENLAKE.render_text(fixed, FrozenLakeParams(desc=DESC_4X4)) == (
        "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"p": 0.0}, "p=0.0 must be in \\(0, 1\\]"),
        ({"p": 1.5}, "p=1.5"),
        ({"success_rate": -0.1}, "success_rate=-0.1 must be in \\[0, 1\\]"),
        ({"success_rate": 1.01}, "success_rate=1.01"),
        ({"size": 1}, "size=1 must be >= 2"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"desc": ("SFF", "FG")}, "square map"),
        ({"desc": ("SQ", "FG")}, "letter 'Q'"),
        ({"desc": ("SF", "FF")}, "exactly one S and one G"),
    ],
)
def test_impossible_parameters_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        FrozenLakeParams(**overrides)
