"""Success ceilings: exact dynamic programming checked against the JAX environments themselves
(Monte Carlo with the real slippery step) and against cases worked out by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.analysis.ceilings import frozenlake_optimal, frozenlake_replanning, sokoban_solvable
from ragen_jax.envs.frozenlake import FrozenLake, FrozenLakeParams, FrozenLakeState
from ragen_jax.envs.solver import solve_frozenlake

SLIP = 1.0 / 3.0
# S F F F / F H F H / F F F H / H F F G  (gymnasium's 4x4 map)
HOLES = np.array([[0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0]], bool)
START, GOAL = (0, 0), (3, 3)


def test_one_move_next_to_the_goal_is_one_third():
    """From (0,0) with the goal at (0,1): every action reaches it w.p. 1/3 (intended or a slip)."""
    holes = np.zeros((4, 4), bool)
    value, policy = frozenlake_optimal(holes, (0, 0), (0, 1), SLIP, turns=1, per_turn=1, budget=1)
    assert value == pytest.approx(1 / 3)
    assert len(policy) == 1 and len(policy[0][(0, 0)]) == 1


def test_no_moves_left_means_no_success():
    value, _ = frozenlake_optimal(HOLES, START, GOAL, SLIP, turns=3, per_turn=2, budget=0)
    assert value == 0.0
    assert frozenlake_replanning(HOLES, START, GOAL, SLIP, turns=3, per_turn=2, budget=0) == 0.0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 3))
def test_deterministic_lake_success_is_path_length_within_budget(seed, turns, per_turn):
    rng = np.random.default_rng(seed)
    holes = rng.random((4, 4)) < 0.25
    start, goal = (0, 0), (int(rng.integers(0, 4)), int(rng.integers(1, 4)))
    holes[start] = holes[goal] = False
    budget = turns * per_turn
    path = solve_frozenlake(holes, start, goal)
    want = float(path is not None and len(path) <= budget)
    assert frozenlake_optimal(holes, start, goal, 1.0, turns, per_turn, budget)[0] == pytest.approx(want)
    assert frozenlake_replanning(holes, start, goal, 1.0, turns, per_turn, budget) == pytest.approx(want)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_optimal_is_at_least_replanning_and_grows_with_turns(seed):
    rng = np.random.default_rng(seed)
    holes = rng.random((4, 4)) < 0.2
    holes[0, 0] = holes[3, 3] = False
    values = [frozenlake_optimal(holes, (0, 0), (3, 3), SLIP, t, 2, 2 * t)[0] for t in (1, 2, 3)]
    assert values[0] <= values[1] + 1e-12 <= values[2] + 2e-12 <= 1.0 + 3e-12
    assert frozenlake_replanning(holes, (0, 0), (3, 3), SLIP, 3, 2, 6) <= values[2] + 1e-12


def monte_carlo(policy_table, turns, per_turn, episodes=4000, seed=0):
    """Success rate of a per-(turn, cell) move table played in the JAX FrozenLake."""
    env, params = FrozenLake(), FrozenLakeParams(success_rate=SLIP)
    table = jnp.asarray(policy_table)  # [turns, 4, 4, per_turn], 0 = no move

    def episode(key):
        state = FrozenLakeState(holes=jnp.asarray(HOLES), start=jnp.asarray(START, jnp.int32),
                                goal=jnp.asarray(GOAL, jnp.int32), player=jnp.asarray(START, jnp.int32),
                                step_count=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False))
        for t in range(turns):
            moves = table[t, state.player[0], state.player[1]]  # chosen from the turn's first cell
            for j in range(per_turn):
                key, sub = jax.random.split(key)
                stepped, _, _, _ = env.step(sub, state, moves[j], params)
                state = jax.tree.map(lambda new, old: jnp.where(moves[j] > 0, new, old), stepped, state)
        return state.success

    return float(jnp.mean(jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(seed), episodes))))


def table_from(choose, turns, per_turn):
    table = np.zeros((turns, 4, 4, per_turn), np.int32)
    for t in range(turns):
        for r in range(4):
            for c in range(4):
                moves = list(choose(t, (r, c)))[:per_turn]
                table[t, r, c, :len(moves)] = moves
    return table


@pytest.mark.parametrize("turns", [3, 4])
def test_values_match_the_jax_env_played_many_times(turns):
    per_turn, episodes = 2, 4000
    optimal, policy = frozenlake_optimal(HOLES, START, GOAL, SLIP, turns, per_turn, turns * per_turn)
    replan = frozenlake_replanning(HOLES, START, GOAL, SLIP, turns, per_turn, turns * per_turn)
    assert optimal > replan  # on this map slip-aware play beats the shortest path

    got_optimal = monte_carlo(table_from(lambda t, cell: policy[t].get(cell, ()), turns, per_turn), turns, per_turn)
    shortest = lambda t, cell: (solve_frozenlake(HOLES, cell, GOAL) or [])  # noqa: E731
    got_replan = monte_carlo(table_from(shortest, turns, per_turn), turns, per_turn, seed=1)
    for want, got in ((optimal, got_optimal), (replan, got_replan)):
        se = np.sqrt(max(want * (1 - want), 1e-4) / episodes)
        assert abs(got - want) < 4 * se, (want, got)


def test_sokoban_solvable_within_the_budget():
    # a corridor: player, box, target in a row -> one push
    room_fixed = np.array([[0, 0, 0, 0, 0], [0, 1, 1, 2, 0], [0, 0, 0, 0, 0]])
    room_state = np.array([[0, 0, 0, 0, 0], [0, 5, 4, 2, 0], [0, 0, 0, 0, 0]])
    assert sokoban_solvable(room_fixed, room_state, (1, 1), budget=1)
    assert not sokoban_solvable(room_fixed, room_state, (1, 1), budget=0)
    # the box is in a corner away from the target: unsolvable with any budget
    room_fixed = np.array([[0, 0, 0, 0, 0], [0, 1, 1, 2, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    room_state = np.array([[0, 0, 0, 0, 0], [0, 4, 1, 2, 0], [0, 1, 5, 1, 0], [0, 0, 0, 0, 0]])
    assert not sokoban_solvable(room_fixed, room_state, (2, 2), budget=50)


def test_reproduce_ceiling_prints_the_bounds_of_the_validation_levels():
    """`reproduce.py ceiling` plays no model: it reads the config's levels and turn structure."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "reproduce.py"), "ceiling", "--env", "frozenlake",
                          "--eval-episodes", "4", "--set", "rollout.max_turns=2",
                          "--set", "rollout.max_actions_per_traj=4"],
                         capture_output=True, text=True, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "4 validation levels" in run.stdout and "2 turns × ≤2 moves, budget 4" in run.stdout
    best = float(run.stdout.split("best possible success")[1].split()[0])
    replan = float(run.stdout.split("(the demos)")[1].split()[0])
    assert 0.0 <= replan <= best <= 1.0
