"""Sokoban API behaviour: rendering, limits, invalid input, invariants under random play."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.envs.sokoban import SIMPLE_SOKOBAN, SOKOBAN, SokobanParams

# A hand-made level: player left of a box, target right of it, a second target covered.
#   # # # # # #
#   # P X _ O #
#   # _ _ √ _ #
#   # # # # # #   (6 wide, 5 tall: rows 0..4)
FIXED = np.array(
    [
        [0, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 2, 0],
        [0, 1, 1, 2, 1, 0],
        [0, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0],
    ]
)
ROOM = FIXED.copy()
ROOM[1, 1], ROOM[1, 2], ROOM[2, 3] = 5, 4, 3
PARAMS = SokobanParams(dim_room=(5, 6), num_boxes=2, max_steps=6)


@pytest.fixture(scope="module")
def step():
    return jax.jit(SOKOBAN.step, static_argnums=3)


def _start():
    return SOKOBAN.state_from_rooms(FIXED, ROOM, PARAMS)


def test_render_grid_and_grid_coord():
    state = _start()
    assert SOKOBAN.render_text(state, PARAMS) == (
        "# # # # # #\n# P X _ O #\n# _ _ √ _ #\n# _ _ _ _ #\n# # # # # #"
    )
    assert SOKOBAN.render_text(state, PARAMS, "grid_coord").splitlines()[:4] == [
        "Board size: 5 rows x 6 cols",
        "Targets: (1, 4), (2, 3)",
        "Boxes: (1, 2), (2, 3)",
        "Player: (1, 1)",
    ]
    with pytest.raises(ValueError, match="render format 'ascii'.*allowed"):
        SOKOBAN.render_text(state, PARAMS, "ascii")


def test_push_onto_target_then_off_then_player_on_target(step):
    state = _start()
    assert int(state.boxes_on_target) == 1
    key = jax.random.key(0)
    state, reward, done, info = step(key, state, 4, PARAMS)  # push right: box to (1,3)
    assert float(reward) == pytest.approx(-0.1) and not done and bool(info["action_is_effective"])
    state, reward, done, info = step(key, state, 4, PARAMS)  # push right: box onto (1,4) target
    assert float(reward) == pytest.approx(10.9) and bool(done) and bool(info["success"])
    assert not bool(info["truncated"])
    assert SOKOBAN.render_text(state, PARAMS).splitlines()[1] == "# _ _ P √ #"
    # A finished episode does not move any more.
    after, reward, done, info = step(key, state, 3, PARAMS)
    assert float(reward) == 0.0 and bool(done) and not bool(info["action_is_effective"])
    np.testing.assert_array_equal(after.room_state, state.room_state)

    state = _start()
    state, *_ = step(key, state, 2, PARAMS)  # down to (2,1)
    state, *_ = step(key, state, 4, PARAMS)  # right to (2,2)
    state, reward, *_ = step(key, state, 4, PARAMS)  # push √ off its target to (2,4)
    assert float(reward) == pytest.approx(-1.1)
    assert SOKOBAN.render_text(state, PARAMS).splitlines()[2] == "# _ _ S X #"


def test_blocked_and_invalid_actions_cost_a_step_and_truncate(step):
    state = _start()
    key = jax.random.key(0)
    for t, action in enumerate([1, 0, 5, 3, 1, -2], start=1):  # wall, invalid, invalid, wall...
        state, reward, done, info = step(key, state, action, PARAMS)
        assert float(reward) == pytest.approx(-0.1)
        assert not bool(info["action_is_effective"])
        assert bool(info["action_is_valid"]) == (1 <= action <= 4)
        assert int(state.step_count) == t
    assert bool(done) and bool(info["truncated"]) and not bool(info["success"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dim_room=(4, 6)), "too small"),
        (dict(dim_room=(5, 5), num_boxes=8), "does not fit"),
        (dict(num_boxes=0), "num_boxes=0"),
        (dict(max_steps=0), "max_steps=0"),
        (dict(search_depth=1), "search_depth=1"),
        (dict(p_change_direction=1.5), "p_change_direction"),
    ],
)
def test_impossible_parameters_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SokobanParams(**kwargs)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), actions=st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_invariants_under_random_play(seed, actions):
    params = SIMPLE_SOKOBAN.replace(max_steps=20)
    state = _reset(jax.random.key(seed), params)
    walls = np.asarray(state.room_fixed) == 0
    for t, action in enumerate(actions, start=1):
        was_done = bool(state.done)
        state, reward, done, info = _step(jax.random.key(0), state, action, params)
        room = np.asarray(state.room_state)
        assert ((room == 3) | (room == 4)).sum() == params.num_boxes
        assert (room == 5).sum() == 1
        assert np.all(room[walls] == 0)
        assert bool(done) == (bool(state.success) or int(state.step_count) >= params.max_steps)
        if was_done:
            assert float(reward) == 0.0
        else:
            assert int(state.step_count) == t


_reset = jax.jit(SOKOBAN.reset, static_argnums=1)
_step = jax.jit(SOKOBAN.step, static_argnums=3)
