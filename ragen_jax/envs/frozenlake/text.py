"""FrozenLake as the policy reads it: the board's symbols, its coordinate lines and the rules."""

from __future__ import annotations

import numpy as np

from ragen_jax.envs.frozenlake.maps import FrozenLakeParams, FrozenLakeState
from ragen_jax.envs.text_view import TextView, format_cells, moves_into


class FrozenLakeText(TextView):
    """The text view of `FrozenLakeGame`; symbol ids are `game.py`'s (`FROZEN`, `HOLE`, ...)."""

    symbols = ("_", "O", "G", "P", "X", "√")
    render_formats = ("grid", "grid_coord")
    blocked_kind = "holes"

    def coordinate_lines(self, state: FrozenLakeState, params: FrozenLakeParams) -> list[str]:
        goal, player = np.asarray(state.goal), np.asarray(state.player)
        return [
            f"Board size: {params.size} rows x {params.size} cols",
            f"Goal: ({goal[0]}, {goal[1]})",
            f"Holes: {format_cells(state.holes) or 'none'}",
            f"Player: ({player[0]}, {player[1]})",
        ]

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

    def instructions(self) -> str:
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. The ice "
            "is slippery: you may move in a direction perpendicular to the one you chose. "
            "The symbols are: _ frozen tile, O hole, G goal, P player, X player in a hole, "
            "√ player on the goal."
        )
