"""FrozenLake as the policy reads it: the board's symbols, its coordinate lines and the rules."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.frozenlake.maps import FrozenLakeParams, FrozenLakeState
from ragen_jax.envs.coordinates import RENDER_FORMATS, cell_mask
from ragen_jax.envs.text_view import TextView, moves_into


class FrozenLakeText(TextView):
    """The text view of `FrozenLakeGame`; symbol ids are `game.py`'s (`FROZEN`, `HOLE`, ...)."""

    symbols = ("_", "O", "G", "P", "X", "√")
    render_formats = RENDER_FORMATS
    blocked_kind = "holes"

    coordinate_labels = ("Goal", "Holes", "Player")

    def board_shape(self, params: FrozenLakeParams) -> tuple[int, int]:
        return params.size, params.size

    def coordinate_cells(self, state: FrozenLakeState, params: FrozenLakeParams):
        shape = (params.size, params.size)
        return [(cell_mask(shape, state.goal), 1), (jnp.asarray(state.holes), params.size * params.size),
                (cell_mask(shape, state.player), 1)]

    def demo_reasoning(self, state: FrozenLakeState, params: FrozenLakeParams, moves: list[str],
                       name_blocked: bool = False) -> str:
        """Where the player and the goal are (and with `name_blocked` the moves that would step into
        a hole: "…, holes: Left, Down. I move …"), and the moves."""
        player = tuple(int(x) for x in np.asarray(state.player))
        goal = tuple(int(x) for x in np.asarray(state.goal))
        if not name_blocked:
            return f"Player {player}, goal {goal}. I move {' then '.join(moves)}."
        # without them the fitted policy walks into a hole in 30% of slip-free episodes, with them
        # in 14% (0.655 on the slippery lake against 0.595 after the same fitting: docs/tuning.md, naming the holes)
        holes = ", ".join(moves_into(state.holes, player, self.action_names)) or "none"
        return f"Player {player}, goal {goal}, holes: {holes}. I move {' then '.join(moves)}."

    def grade_reasoning(self, state: FrozenLakeState, params: FrozenLakeParams, reasoning: str):
        """The template's player cell and the moves it names into a hole."""
        return self.grade_template(reasoning, np.asarray(state.player), np.asarray(state.holes, bool))

    def instructions(self) -> str:
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. The ice "
            "is slippery: you may move in a direction perpendicular to the one you chose. "
            "The symbols are: _ frozen tile, O hole, G goal, P player, X player in a hole, "
            "√ player on the goal."
        )
