"""Generated levels: solvable, unsolved, varied, and as hard as gym-sokoban's generator."""

import jax
import numpy as np
import pytest

from gym_sokoban_ref import gym_generate_room
from ragen_jax.envs.sokoban import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SOKOBAN, generator
from ragen_jax.envs.solver import solve_sokoban

NUM_LEVELS = 400
PRESETS = {"simple": SIMPLE_SOKOBAN, "larger": LARGER_SOKOBAN}


def _optimal_length(fixed, room):
    plan = solve_sokoban(fixed == 0, fixed == 2, (room == 3) | (room == 4), np.argwhere(room == 5)[0])
    return None if plan is None else len(plan)


@pytest.fixture(scope="module", params=list(PRESETS), ids=list(PRESETS))
def generated(request):
    params = PRESETS[request.param]
    keys = jax.random.split(jax.random.key(2024), NUM_LEVELS)
    states = jax.jit(SOKOBAN.reset_batch, static_argnums=1)(keys, params)
    return params, keys, jax.device_get(states)


def test_levels_are_well_formed(generated):
    params, _, states = generated
    for fixed, room in zip(states.room_fixed, states.room_state):
        assert np.all(fixed[0] == 0) and np.all(fixed[-1] == 0)
        assert np.all(fixed[:, 0] == 0) and np.all(fixed[:, -1] == 0)
        assert (fixed == 2).sum() == params.num_boxes
        assert ((room == 3) | (room == 4)).sum() == params.num_boxes
        assert (room == 5).sum() == 1
        assert fixed[room == 5][0] != 2, "the player never starts on a target"
        assert np.all(room[fixed == 0] == 0), "walls are walls in both grids"
    np.testing.assert_array_equal(states.player, [np.argwhere(r == 5)[0] for r in states.room_state])
    assert not states.done.any() and not states.success.any()
    assert np.all(states.boxes_on_target == 0)


def test_levels_are_solvable_unsolved_and_distinct(generated):
    _, _, states = generated
    lengths = [_optimal_length(f, r) for f, r in zip(states.room_fixed, states.room_state)]
    assert None not in lengths, "every generated level is solvable"
    assert min(lengths) > 0, "no level starts solved"
    distinct = {r.tobytes() for r in states.room_state}
    assert len(distinct) >= 0.95 * NUM_LEVELS


def test_difficulty_matches_gym_sokoban(generated):
    """Mean BFS-optimal solution length of ours vs gym-sokoban's generator, same settings."""
    params, _, states = generated
    ours = np.array([_optimal_length(f, r) for f, r in zip(states.room_fixed, states.room_state)])
    theirs = []
    for seed in range(300):
        fixed, room = gym_generate_room(params.dim_room, params.num_boxes, params.search_depth, seed)
        theirs.append(_optimal_length(fixed, room))
    theirs = np.array(theirs)
    se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    # Not easier (beyond sampling noise), and not a different game either.
    assert ours.mean() >= theirs.mean() - 3 * se, (ours.mean(), theirs.mean())
    assert ours.mean() <= 1.5 * theirs.mean(), (ours.mean(), theirs.mean())


def test_batched_generation_equals_one_by_one(generated):
    params, keys, states = generated
    one = jax.jit(jax.vmap(SOKOBAN.reset, in_axes=(0, None)), static_argnums=1)(keys[:64], params)
    np.testing.assert_array_equal(np.asarray(one.room_state), states.room_state[:64])
    np.testing.assert_array_equal(np.asarray(one.room_fixed), states.room_fixed[:64])


def test_same_key_same_level_different_keys_differ():
    params = SIMPLE_SOKOBAN
    reset = jax.jit(SOKOBAN.reset, static_argnums=1)
    a, b = reset(jax.random.key(3), params), reset(jax.random.key(3), params)
    c = reset(jax.random.key(4), params)
    np.testing.assert_array_equal(a.room_state, b.room_state)
    assert not np.array_equal(a.room_state, c.room_state)


def test_topology_matches_gym_walk_statistics():
    """Our random-walk rooms have the same floor-size distribution as gym-sokoban's."""
    from gym_sokoban.envs import room_utils
    import random

    params = SIMPLE_SOKOBAN
    floors = jax.jit(jax.vmap(lambda k: generator.room_topology(k, params)))(jax.random.split(jax.random.key(5), 2000))
    ours = np.asarray(floors).sum((1, 2))
    random.seed(0)
    theirs = np.array([room_utils.room_topology_generation((6, 6), 0.35, params.gen_steps).sum() for _ in range(2000)])
    se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se, (ours.mean(), theirs.mean())
    assert set(np.unique(ours)) <= set(range(3, 17))
