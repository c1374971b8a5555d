"""The reasoning-template check: each game grades what a reasoning states against the state arrays
it was shown (hand-built boards, and a plain loop over the neighbours as the reference for the
named moves), the counts over turns, and real validations (the shipped warm start follows the
template: tests/training/test_sft.py; a random model gets no metrics: test_validation.py)."""

import jax
import numpy as np
import pytest

from ragen_jax.diagnostics import reasoning_check
from ragen_jax.envs import registry
from ragen_jax.envs.frozenlake.maps import FrozenLakeState
from ragen_jax.envs.sokoban.board import FLOOR, WALL, SokobanState

SOKOBAN, SOKOBAN_PARAMS = registry.make("SimpleSokoban")
LAKE, LAKE_PARAMS = registry.make("FrozenLake")
OFFSETS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def sokoban_state(fixed, player) -> SokobanState:
    fixed = np.asarray(fixed, np.int32)
    return SokobanState(fixed, fixed.copy(), np.asarray(player, np.int32), np.int32(0), np.int32(0),
                        np.bool_(False), np.bool_(False))


def lake_state(holes, player) -> FrozenLakeState:
    cell = np.asarray(player, np.int32)
    return FrozenLakeState(np.asarray(holes, bool), cell, np.zeros(2, np.int32), cell, np.int32(0),
                           np.bool_(False), np.bool_(False))


# a 4×4 room: walls around, the player at (1, 2) has walls above and to the right
ROOM = np.full((4, 4), WALL)
ROOM[1:3, 1:3] = FLOOR


def test_sokoban_grades_the_stated_cell_and_the_walls_on_the_arrays():
    state = sokoban_state(ROOM, (1, 2))
    grade = lambda text: SOKOBAN.grade_reasoning(state, SOKOBAN_PARAMS, text)
    assert grade("Player (1, 2), box (2, 1), target (2, 2). I move Left.") == {"player": ((1, 2), True)}
    assert grade("Player (2, 1), box (2, 1). I move Left.") == {"player": ((2, 1), False)}
    assert grade("Player (1, 2), walls: Right, Up. I move Left.")["walls"] == (frozenset({"Up", "Right"}), True)
    assert grade("Player (1, 2), walls: Up. I move Left.")["walls"] == (frozenset({"Up"}), False)
    assert grade("Player (1, 2), holes: Up, Right. I move Left.") == {"player": ((1, 2), True)}  # not Sokoban's
    assert grade("free text about the board") == {}
    inside = sokoban_state(ROOM, (2, 1))  # walls below and to the left
    assert SOKOBAN.grade_reasoning(inside, SOKOBAN_PARAMS, "walls: none.")["walls"] == (frozenset(), False)


def test_frozenlake_grades_the_holes_next_to_the_player():
    holes = np.zeros((3, 4), bool)
    holes[1, 1] = holes[2, 2] = True
    grade = lambda player, text: LAKE.grade_reasoning(lake_state(holes, player), LAKE_PARAMS, text)
    assert grade((1, 2), "Player (1, 2), goal (0, 1), holes: Left, Down. I move Up.") == {
        "player": ((1, 2), True), "holes": (frozenset({"Left", "Down"}), True)}
    assert grade((1, 2), "Player (1, 2), goal (0, 1), holes: Down. I move Up.")["holes"][1] is False
    assert grade((2, 0), "Player (2, 0), goal (0, 1), holes: none. I move Up.")["holes"] == (frozenset(), True)
    assert "holes" not in grade((1, 2), "Player (1, 2), walls: Left, Down. I move Up.")


def test_the_demonstrations_reasoning_is_graded_right_and_matches_a_plain_loop():
    """Property: on random levels the warm start's own reasoning (`demo_reasoning`) is right in
    every fact, and the named moves are the neighbours a plain loop over the four offsets finds."""
    for env, params, blocked_of in ((SOKOBAN, SOKOBAN_PARAMS, lambda s: np.asarray(s.room_fixed) == WALL),
                                    (LAKE, LAKE_PARAMS, lambda s: np.asarray(s.holes))):
        states = jax.device_get(env.reset_batch(jax.random.split(jax.random.key(3), 12), params))
        for b in range(12):
            state = jax.tree.map(lambda x: x[b], states)
            text = env.demo_reasoning(state, params, ["Up"], name_blocked=True)
            grades = env.grade_reasoning(state, params, text)
            assert set(grades) == {"player", env.blocked_kind} and all(ok for _, ok in grades.values()), text
            blocked, (r, c) = blocked_of(state), np.asarray(state.player)
            loop = {name for name, (dr, dc) in OFFSETS.items() if 0 <= r + dr < blocked.shape[0]
                    and 0 <= c + dc < blocked.shape[1] and blocked[r + dr, c + dc]}
            assert grades[env.blocked_kind][0] == loop


def test_scores_count_stated_right_and_consistent_turns():
    turns = [({"player": ((1, 2), True)}, "… I move Left then Down. </think> <answer> Left || Down </answer>"),
             ({"player": ((1, 2), False)}, "… I move Up. </think> <answer> Down </answer>"),
             ({}, "garbled </think> <answer> Up </answer>")]
    scores = reasoning_check.reading_scores(turns)
    assert scores == pytest.approx({"turns": 3, "answer_repeats_reasoning": 1 / 2, "player_stated": 2 / 3,
                                    "player_right": 1 / 2, "player_top_share": 1.0})


def test_top_share_tells_a_fixed_string_from_a_reading():
    reading = [({"player": (cell, True)}, "") for cell in [(1, 2), (2, 1), (1, 2), (2, 1)]]
    fixed = [({"player": ((2, 2), False)}, "")] * 3 + [({"player": ((2, 1), True)}, "")]
    read, stuck = reasoning_check.reading_scores(reading), reasoning_check.reading_scores(fixed)
    assert (read["player_right"], read["player_top_share"]) == (1.0, 0.5)
    assert (stuck["player_right"], stuck["player_top_share"]) == (0.25, 0.75)
    assert "walls_stated" not in read
