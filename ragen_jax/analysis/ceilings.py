"""How well could any policy do? Exact success ceilings for the board games' turn structure.

A learning run can only improve up to what the task allows. Here the task is fixed by the
config: `max_turns` turns of at most `max_actions_per_turn` moves each, within a budget of
`max_actions_per_traj` moves, and the agent sees the board only between turns (the moves
of one turn are committed together).

- FrozenLake with slip: the best policy's success probability by exact dynamic programming
  over (turn, cell), choosing each turn's move sequence with the turn's outcome distribution;
  and the success of the policy the warm start imitates (each turn, the first moves of a
  shortest path that ignores the slip).
- Sokoban is deterministic: a level is solvable by some policy iff the BFS solver finds a
  solution within the move budget (`solvable`: the same for any game with a solver, through
  its `solve` hook).

Plain Python/NumPy on the host, one level at a time (4×4 lakes have 16 cells).
"""

from __future__ import annotations

import itertools

import numpy as np

from ragen_jax.envs.game import require_solver
from ragen_jax.envs.sokoban import solve_level
from ragen_jax.envs.solver import FROZENLAKE_MOVES, solve_frozenlake

SEARCH_STATES = 200_000  # the solver's search bound per level (a level beyond it counts as unsolvable)


def _moves_per_turn(turns: int, per_turn: int, budget: int) -> list[int]:
    """How many moves each turn may use at most: `per_turn`, until the budget runs out."""
    counts = []
    for _ in range(turns):
        counts.append(max(0, min(per_turn, budget)))
        budget -= counts[-1]
    return counts


class _Lake:
    """One map's slippery transitions: from a cell, an action (1..4) leads to each next cell
    with the probabilities of the env (intended w.p. `success_rate`, each perpendicular
    direction w.p. half the rest; moves off the board stay put)."""

    def __init__(self, holes, goal, success_rate: float):
        self.holes = np.asarray(holes, dtype=bool)
        self.goal = (int(goal[0]), int(goal[1]))
        self.rows, self.cols = self.holes.shape
        slip = (1.0 - success_rate) / 2.0
        self.outcomes = {}
        for r, c in itertools.product(range(self.rows), range(self.cols)):
            for action in range(1, 5):
                a = action - 1
                dist: dict[tuple[int, int], float] = {}
                for direction, p in ((a, success_rate), ((a - 1) % 4, slip), ((a + 1) % 4, slip)):
                    if p > 0:
                        dr, dc = FROZENLAKE_MOVES[direction]
                        cell = (min(max(r + dr, 0), self.rows - 1), min(max(c + dc, 0), self.cols - 1))
                        dist[cell] = dist.get(cell, 0.0) + p
                self.outcomes[(r, c), action] = dist

    def ended(self, cell) -> bool:
        return cell == self.goal or bool(self.holes[cell])

    def play_turn(self, cell, actions) -> tuple[float, dict]:
        """Commit `actions` from `cell`: (probability of reaching the goal during the turn,
        distribution of the live cells at its end). The episode ends in the goal or a hole."""
        reached, live = 0.0, {cell: 1.0}
        for action in actions:
            after: dict = {}
            for here, p in live.items():
                for there, q in self.outcomes[here, action].items():
                    if there == self.goal:
                        reached += p * q
                    elif not self.holes[there]:
                        after[there] = after.get(there, 0.0) + p * q
            live = after
        return reached, live


def _best_per_turn(lake: _Lake, moves_per_turn: list[int], candidates, may_pass: bool) -> tuple[dict, list[dict]]:
    """Backward over the turns: a cell's value is the best, over `candidates(cell, moves)`
    (move sequences to commit this turn; and making no move when `may_pass` or there is no
    candidate), of the success probability from there. Returns the first turn's values and
    the chosen sequence per turn and cell."""
    cells = list(itertools.product(range(lake.rows), range(lake.cols)))
    value = {cell: float(cell == lake.goal) for cell in cells}  # after the last turn
    policy = []
    for moves in reversed(moves_per_turn):
        new, choice = dict(value), {}
        for cell in cells:
            if lake.ended(cell):
                continue
            choice[cell] = ()  # no move (an unparseable answer does not step the env)
            for seq in candidates(cell, moves):
                reached, live = lake.play_turn(cell, seq)
                v = reached + sum(p * value[c] for c, p in live.items())
                if v > new[cell] or not may_pass:
                    new[cell], choice[cell] = v, seq
        value = new
        policy.insert(0, choice)
    return value, policy


def frozenlake_optimal(holes, start, goal, success_rate: float, turns: int, per_turn: int,
                       budget: int) -> tuple[float, list[dict]]:
    """The highest success probability any policy reaches from `start` (exact), and a policy
    that reaches it: `policy[t][cell]`, the moves to commit at turn t from `cell`."""
    lake = _Lake(holes, goal, success_rate)

    def every_sequence(cell, moves):
        return (seq for n in range(1, moves + 1) for seq in itertools.product(range(1, 5), repeat=n))

    value, policy = _best_per_turn(lake, _moves_per_turn(turns, per_turn, budget), every_sequence, may_pass=True)
    return value[(int(start[0]), int(start[1]))], policy


def frozenlake_replanning(holes, start, goal, success_rate: float, turns: int, per_turn: int, budget: int) -> float:
    """Success probability of re-planning a slip-blind shortest path every turn and playing
    its first moves (the warm start's demonstrations without noise)."""
    lake = _Lake(holes, goal, success_rate)

    def shortest_path_start(cell, moves):
        plan = solve_frozenlake(lake.holes, cell, lake.goal) if moves else None
        return [tuple(plan[:moves])] if plan else []  # ended, out of moves or unreachable: no move

    value, _ = _best_per_turn(lake, _moves_per_turn(turns, per_turn, budget), shortest_path_start,
                              may_pass=False)
    return value[(int(start[0]), int(start[1]))]


def solvable(env, state, params, budget: int) -> bool:
    """Whether some sequence of at most `budget` moves solves the episode `state` (host arrays)
    of a deterministic game, by the game's solver."""
    require_solver(env, "the solvability ceiling")
    plan = env.solve(state, params, max_states=SEARCH_STATES)
    return plan is not None and len(plan) <= budget


def sokoban_solvable(room_fixed, room_state, player, budget: int) -> bool:
    """`solvable` for a Sokoban level given as gym-sokoban room arrays."""
    plan = solve_level(room_fixed, room_state, player, max_states=SEARCH_STATES)
    return plan is not None and len(plan) <= budget
