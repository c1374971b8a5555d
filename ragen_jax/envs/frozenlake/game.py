"""The FrozenLake game: walk from the start to the goal without falling into a hole.

With probability `success_rate` the agent moves where it meant to; otherwise it slips to one
of the two perpendicular directions, each with half the remaining probability (gymnasium's
semantics: `success_rate=1/3` is the classic slippery lake, `1.0` is deterministic).
Moves are clipped at the border. Reaching the goal pays +1 and ends the episode; a hole
ends it with 0; `max_steps` ends it as a truncation (gymnasium's TimeLimit of 100).
The maps are `maps.py`'s; the text the policy reads is `text.py`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.frozenlake.maps import (
    FrozenLakeParams,
    FrozenLakeState,
    generate_map,
)
from ragen_jax.envs.game import SOLVER_STATES, Game, Info, is_valid_action
from ragen_jax.envs.solver import solve_frozenlake

# Action k (1-based) moves by MOVES[k - 1]: Left, Down, Right, Up (gymnasium's 0..3 plus one).
MOVES = np.array([(0, -1), (1, 0), (0, 1), (-1, 0)], dtype=np.int32)

# Symbol ids of the text grid.
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)


class FrozenLakeGame(Game):
    """Reach the goal on slippery ice. Transitions exactly as gymnasium's FrozenLake."""

    name = "frozenlake"
    action_names = ("Left", "Down", "Right", "Up")

    def default_params(self) -> FrozenLakeParams:
        return FrozenLakeParams()

    def state_from_map(self, holes, start, goal) -> FrozenLakeState:
        """A fresh episode on a given map, the player on the start cell."""
        start = jnp.asarray(start, jnp.int32)
        return FrozenLakeState(
            holes=jnp.asarray(holes, bool),
            start=start,
            goal=jnp.asarray(goal, jnp.int32),
            player=start,
            step_count=jnp.int32(0),
            done=jnp.bool_(False),
            success=jnp.bool_(False),
        )

    def reset(self, key: jax.Array, params: FrozenLakeParams) -> FrozenLakeState:
        return self.state_from_map(*generate_map(key, params))

    def step(self, key: jax.Array, state: FrozenLakeState, action: jax.Array, params: FrozenLakeParams):
        action = jnp.asarray(action, jnp.int32)
        valid = is_valid_action(action, self.num_actions)
        intended = jnp.clip(action - 1, 0, 3)  # gymnasium's action number
        # Slip: intended w.p. success_rate, else (a - 1) % 4 or (a + 1) % 4, half each.
        u = jax.random.uniform(key)
        slip = (1.0 - params.success_rate) / 2.0
        slipped = jnp.where(u < params.success_rate + slip, (intended - 1) % 4, (intended + 1) % 4)
        direction = jnp.where(u < params.success_rate, intended, slipped)
        size = params.size
        target = jnp.clip(state.player + jnp.asarray(MOVES)[direction], 0, size - 1)
        player = jnp.where(valid, target, state.player)

        success = (player == state.goal).all()
        in_hole = state.holes[player[0], player[1]]
        step_count = state.step_count + 1
        done = success | in_hole | (step_count >= params.max_steps)
        stepped = FrozenLakeState(
            holes=state.holes,
            start=state.start,
            goal=state.goal,
            player=player,
            step_count=step_count,
            done=done,
            success=success,
        )
        # A finished episode stays as it is.
        finished = state.done
        new_state = jax.tree.map(lambda old, new: jnp.where(finished, old, new), state, stepped)
        reward = jnp.where(success & ~finished, 1.0, 0.0).astype(jnp.float32)
        ended_in_hole = new_state.holes[new_state.player[0], new_state.player[1]]
        info: Info = {
            "success": new_state.success,
            "action_is_valid": valid,
            "action_is_effective": (player != state.player).any() & ~finished,
            "truncated": new_state.done & ~new_state.success & ~ended_in_hole,
        }
        return new_state, reward, new_state.done, info

    def symbol_grid(self, state: FrozenLakeState, params: FrozenLakeParams) -> jax.Array:
        size = params.size
        rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
        is_goal = (rows == state.goal[0]) & (cols == state.goal[1])
        is_player = (rows == state.player[0]) & (cols == state.player[1])
        board = jnp.where(state.holes, HOLE, jnp.where(is_goal, GOAL, FROZEN))
        player = jnp.where(state.holes, PLAYER_IN_HOLE, jnp.where(is_goal, PLAYER_ON_GOAL, PLAYER))
        return jnp.where(is_player, player, board).astype(jnp.int32)

    def solve(self, state: FrozenLakeState, params: FrozenLakeParams,
              max_states: int = SOLVER_STATES) -> list[int] | None:
        """The shortest path to the goal around the holes, as if the lake were not slippery
        (`solver.solve_frozenlake`; a lake is small, so `max_states` never binds)."""
        return solve_frozenlake(np.asarray(state.holes), np.asarray(state.player), np.asarray(state.goal))

    def deterministic_params(self, params: FrozenLakeParams) -> FrozenLakeParams:
        """No slip: every move goes where it was meant to."""
        return params.replace(success_rate=1.0)
