"""benchmarks/board_reading.py's solver grading of first-turn plans, on a hand-made level
(the reasoning-template shares are ragen_jax.diagnostics.reasoning_check's: tests/evaluation)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import board_reading  # noqa: E402


def test_first_turn_plans_grade_reasoning_and_answer_against_the_solver():
    """A 6×6 level by hand: player (1, 3) above the box (2, 3) above the target (3, 3), so
    Down solves it in one move. With a budget of 2, Right || Down spends both moves without
    pushing the box (lost), while Left || Down and Up then Down bump a wall first and then
    push the box home (kept). Only Down is the solver's first move."""
    import numpy as np

    from ragen_jax.envs import registry

    env, params = registry.make("sokoban")
    fixed = np.zeros((6, 6), np.int32)
    fixed[1:5, 3:5] = 1
    fixed[3, 3] = 2
    room = fixed.copy()
    room[1, 3], room[2, 3] = 5, 4  # player, box
    start = env.state_from_rooms(fixed, room, params)
    assert env.render_text(start, params).split("\n")[1].split() == ["#", "#", "#", "P", "_", "#"]
    firsts = [(start, "Player (1, 3), box (2, 3), target (3, 3). I move Down. </think> "
                      "<answer> Right || Down </answer>"),
              (start, "Player (1, 3), box (2, 3), target (3, 3). I move Up then Down. </think> "
                      "<answer> Left || Down </answer>"),
              (start, "free text </think> <answer> Down </answer>")]  # no template: not graded
    plans = board_reading.first_turn_plans(firsts, env, params, budget=2, turns=2, per_turn=2)
    assert plans["levels"] == 2
    assert plans["reasoning_keeps"] == 1.0  # Down; Up (a wall) then Down
    assert plans["answer_keeps"] == 0.5  # Right || Down loses, Left (a wall) || Down solves
    assert plans["reasoning_first_optimal"] == 0.5 and plans["answer_first_optimal"] == 0.0
    # Up alone (a wall) leaves a move of the budget, but no turn to make it in when there is
    # only one: the turn limit counts, not just the budget
    one_turn = [(start, "Player (1, 3), box (2, 3), target (3, 3). I move Up. </think> <answer> Up </answer>")]
    plans = board_reading.first_turn_plans(one_turn, env, params, budget=2, turns=1, per_turn=2)
    assert plans["levels"] == 1 and plans["reasoning_keeps"] == 0.0 and plans["answer_keeps"] == 0.0
    plans = board_reading.first_turn_plans(one_turn, env, params, budget=2, turns=2, per_turn=2)
    assert plans["reasoning_keeps"] == 1.0 and plans["answer_keeps"] == 1.0


def test_lake_outcomes_tally_levels_and_early_failures():
    """Two levels × 3 attempts: level 0 solved twice (one failure ran all 3 turns), level 1
    never (one failure ended after turn 1, one after turn 2, one ran all turns)."""
    success = [True, False, True, False, False, False]
    turn_active = [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    tally = board_reading.lake_outcomes(success, turn_active, samples=3)
    assert tally == dict(success=2 / 6, failed_before_last_turn=2 / 6, levels=2, never_solved=1, always_solved=0)
    assert board_reading.lake_outcomes([True] * 4, [[1, 0]] * 4, samples=2)["always_solved"] == 2
