"""The Sokoban game: push every box onto a target, with gym-sokoban's rules and rewards.

The dynamics only: `text.py` is how the policy reads the board, and the package joins the two
as `Sokoban`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.game import SOLVER_STATES, Game, Info, is_valid_action
from ragen_jax.envs.sokoban.board import (BOX, BOX_ON_TARGET, FLOOR, MOVES, PLAYER, PLAYER_ON_TARGET, SIMPLE_SOKOBAN,
                                          TARGET, WALL, SokobanParams, SokobanState)
from ragen_jax.envs.sokoban.generator import generate_level, generate_levels
from ragen_jax.envs.solver import solve_sokoban

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
FINISHED_REWARD = 10.0


def _count_empty_targets(room_fixed: jax.Array, room_state: jax.Array) -> jax.Array:
    """Targets without a box: visible ones plus the one the player may stand on."""
    visible = room_state == TARGET
    under_player = (room_fixed == TARGET) & (room_state == PLAYER)
    return (visible | under_player).sum()


class SokobanGame(Game):
    """Push every box onto a target. Rewards, pushes and limits exactly as gym-sokoban."""

    name = "sokoban"
    action_names = ("Up", "Down", "Left", "Right")

    def default_params(self) -> SokobanParams:
        return SIMPLE_SOKOBAN

    def state_from_rooms(self, room_fixed, room_state, params: SokobanParams) -> SokobanState:
        """A fresh episode on a given level (gym-sokoban room arrays)."""
        room_fixed = jnp.asarray(room_fixed, jnp.int32)
        room_state = jnp.asarray(room_state, jnp.int32)
        rows, cols = params.dim_room
        flat = jnp.argmax((room_state == PLAYER).ravel())
        player = jnp.stack([flat // cols, flat % cols]).astype(jnp.int32)
        on_target = params.num_boxes - _count_empty_targets(room_fixed, room_state)
        return SokobanState(
            room_fixed=room_fixed,
            room_state=room_state,
            player=player,
            boxes_on_target=on_target.astype(jnp.int32),
            step_count=jnp.int32(0),
            done=jnp.bool_(False),
            success=jnp.bool_(False),
        )

    def reset(self, key: jax.Array, params: SokobanParams) -> SokobanState:
        room_fixed, room_state, _ = generate_level(key, params)
        return self.state_from_rooms(room_fixed, room_state, params)

    def reset_batch(self, keys: jax.Array, params: SokobanParams) -> SokobanState:
        """`vmap(reset)` that retries only the levels that need it (same levels, faster)."""
        room_fixed, room_state, _ = generate_levels(keys, params)
        return jax.vmap(self.state_from_rooms, in_axes=(0, 0, None))(room_fixed, room_state, params)

    def step(self, key: jax.Array, state: SokobanState, action: jax.Array, params: SokobanParams):
        del key  # Sokoban is deterministic
        action = jnp.asarray(action, jnp.int32)
        valid = is_valid_action(action, self.num_actions)
        rows, cols = params.dim_room
        room_fixed, room = state.room_fixed, state.room_state

        delta = jnp.asarray(MOVES)[jnp.clip(action - 1, 0, 3)]
        here = state.player
        ahead = here + delta
        beyond = here + 2 * delta
        beyond_inside = (beyond >= 0).all() & (beyond[0] < rows) & (beyond[1] < cols)
        beyond = jnp.clip(beyond, 0, jnp.array([rows - 1, cols - 1]))
        cell_ahead = room[ahead[0], ahead[1]]
        cell_beyond = room[beyond[0], beyond[1]]

        box_ahead = (cell_ahead == BOX) | (cell_ahead == BOX_ON_TARGET)
        free_beyond = (cell_beyond == FLOOR) | (cell_beyond == TARGET)
        # A finished episode stays as it is: nothing moves, nothing is counted.
        finished = state.done
        active = valid & ~finished
        push = active & box_ahead & free_beyond & beyond_inside
        walk = active & ((cell_ahead == FLOOR) | (cell_ahead == TARGET))
        moved = push | walk

        moved_room = room.at[here[0], here[1]].set(room_fixed[here[0], here[1]])
        moved_room = moved_room.at[ahead[0], ahead[1]].set(PLAYER)
        onto_target = room_fixed[beyond[0], beyond[1]] == TARGET
        pushed_room = moved_room.at[beyond[0], beyond[1]].set(jnp.where(onto_target, BOX_ON_TARGET, BOX))
        new_room = jnp.where(push, pushed_room, jnp.where(moved, moved_room, room))
        player = jnp.where(moved, ahead, here)

        # Only a push changes which boxes sit on targets: the box leaves `ahead`, lands `beyond`.
        off_target = room_fixed[ahead[0], ahead[1]] == TARGET
        on_target = state.boxes_on_target + (push & onto_target) - (push & off_target)
        success = on_target == params.num_boxes
        reward = (
            STEP_PENALTY
            + jnp.where(on_target > state.boxes_on_target, BOX_ON_TARGET_REWARD, 0.0)
            + jnp.where(on_target < state.boxes_on_target, BOX_OFF_TARGET_PENALTY, 0.0)
            + jnp.where(success, FINISHED_REWARD, 0.0)
        )
        step_count = state.step_count + (~finished)
        done = finished | success | (step_count >= params.max_steps)
        new_state = SokobanState(
            room_fixed=room_fixed,
            room_state=new_room,
            player=player,
            boxes_on_target=on_target.astype(jnp.int32),
            step_count=step_count.astype(jnp.int32),
            done=done,
            success=jnp.where(finished, state.success, success),
        )
        info: Info = {
            "success": new_state.success,
            "action_is_valid": valid,
            "action_is_effective": moved,
            "truncated": new_state.done & ~new_state.success,
        }
        return new_state, jnp.where(finished, 0.0, reward).astype(jnp.float32), new_state.done, info

    def symbol_grid(self, state: SokobanState, params: SokobanParams) -> jax.Array:
        on_target = (state.room_state == PLAYER) & (state.room_fixed == TARGET)
        return jnp.where(on_target, PLAYER_ON_TARGET, state.room_state)

    def solve(self, state: SokobanState, params: SokobanParams, max_states: int = SOLVER_STATES) -> list[int] | None:
        """The BFS solver's optimal plan from this episode's board (`solve_level`)."""
        return solve_level(state.room_fixed, state.room_state, state.player, max_states)


def solve_level(room_fixed, room_state, player, max_states: int = SOLVER_STATES) -> list[int] | None:
    """Host-side: `solver.solve_sokoban` on a level given as gym-sokoban room arrays."""
    fixed, room = np.asarray(room_fixed), np.asarray(room_state)
    return solve_sokoban(fixed == WALL, fixed == TARGET, (room == BOX) | (room == BOX_ON_TARGET), np.asarray(player),
                         max_states=max_states)
