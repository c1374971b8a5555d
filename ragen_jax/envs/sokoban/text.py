"""Sokoban as the policy reads it: the board's symbols, its coordinate lines and the rules."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.sokoban.board import (
    BOX,
    BOX_ON_TARGET,
    TARGET,
    WALL,
    SokobanParams,
    SokobanState,
)
from ragen_jax.envs.coordinates import RENDER_FORMATS, cell_mask, format_cells
from ragen_jax.envs.text_view import TextView, moves_into


class SokobanText(TextView):
    """The text view of `SokobanGame`. Symbol ids are `board.py`'s cell codes: gym-sokoban's,
    and `PLAYER_ON_TARGET`."""

    symbols = ("#", "_", "O", "√", "X", "P", "S")
    render_formats = RENDER_FORMATS
    blocked_kind = "walls"

    coordinate_labels = ("Targets", "Boxes", "Player")

    def board_shape(self, params: SokobanParams) -> tuple[int, int]:
        return tuple(params.dim_room)

    def coordinate_cells(self, state: SokobanState, params: SokobanParams):
        room = jnp.asarray(state.room_state)
        return [(jnp.asarray(state.room_fixed) == TARGET, params.num_boxes),
                ((room == BOX) | (room == BOX_ON_TARGET), params.num_boxes),
                (cell_mask(room.shape, state.player), 1)]

    def demo_reasoning(self, state: SokobanState, params: SokobanParams, moves: list[str],
                       name_blocked: bool = False) -> str:
        """Where the player, the boxes and the targets are (and with `name_blocked` the moves
        into a wall: "…, walls: Up, Right. I move …"), and the moves."""
        targets, boxes, _ = (format_cells(np.asarray(mask)) for mask, _ in self.coordinate_cells(state, params))
        player = tuple(int(x) for x in np.asarray(state.player))
        seen = f"Player {player}, box {boxes}, target {targets}"
        if name_blocked:
            walls = np.asarray(state.room_fixed) == WALL
            seen += f", walls: {', '.join(moves_into(walls, player, self.action_names)) or 'none'}"
        return f"{seen}. I move {' then '.join(moves)}."

    def grade_reasoning(self, state: SokobanState, params: SokobanParams, reasoning: str):
        """The template's player cell and the moves it names into a wall."""
        return self.grade_template(reasoning, np.asarray(state.player), np.asarray(state.room_fixed) == WALL)

    def instructions(self) -> str:
        return (
            "You are solving the Sokoban puzzle. You are the player and you need to push all "
            "boxes onto targets. When you are right next to a box, you can push it by moving in "
            "the same direction. You cannot push a box through a wall, and you cannot pull a box. "
            "The symbols are: # wall, _ empty floor, O target, X box, √ box on target, P player, "
            "S player on a target."
        )
