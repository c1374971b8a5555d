"""The Sokoban board: gym-sokoban's cell codes, the moves, the static parameters of a level
and the state of an episode.

The cell codes are gym-sokoban's, so a state can be compared with (or copied into) the
reference environment array for array:

    room_fixed: 0 wall, 1 floor, 2 target                    (what never moves)
    room_state: 0 wall, 1 floor, 2 empty target, 3 box on target, 4 box, 5 player
"""

from __future__ import annotations

import jax
import numpy as np
from flax import struct

from ragen_jax.envs.coordinates import RENDER_FORMATS

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER = 0, 1, 2, 3, 4, 5
PLAYER_ON_TARGET = 6  # only in symbol grids: gym-sokoban draws it from room_fixed

# Action k (1-based) moves by MOVES[k - 1]: Up, Down, Left, Right.
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)], dtype=np.int32)


@struct.dataclass
class SokobanParams:
    """Static settings (they fix array shapes, so jit specialises on them)."""

    dim_room: tuple[int, int] = struct.field(pytree_node=False, default=(6, 6))
    num_boxes: int = struct.field(pytree_node=False, default=1)
    max_steps: int = struct.field(pytree_node=False, default=100)
    search_depth: int = struct.field(pytree_node=False, default=300)
    # Random-walk steps of the topology; None means gym-sokoban's int(1.7 * (rows + cols)).
    num_gen_steps: int | None = struct.field(pytree_node=False, default=None)
    p_change_direction: float = struct.field(pytree_node=False, default=0.35)
    # Reverse play: a beam this wide, expanded min(search_depth - 1, max_search_steps) times;
    # None caps the rounds at (interior cells - 6), calibrated so that levels are as hard as
    # gym-sokoban's (tests/envs/sokoban/test_sokoban_generator.py measures both).
    reverse_beam: int = struct.field(pytree_node=False, default=8)
    max_search_steps: int | None = struct.field(pytree_node=False, default=None)
    tie_swap: float = struct.field(pytree_node=False, default=0.2)
    # Whole-level regenerations allowed before giving up (a try fails with probability ≪ 1%).
    max_tries: int = struct.field(pytree_node=False, default=64)
    # the observation text: "grid" (the board's symbols) or "grid_coord" (lines listing the
    # targets', boxes' and player's cells, then the grid)
    render_format: str = struct.field(pytree_node=False, default="grid")

    def __post_init__(self):
        if self.render_format not in RENDER_FORMATS:
            raise ValueError(f"render_format={self.render_format!r} is not one of {', '.join(RENDER_FORMATS)}")
        rows, cols = self.dim_room
        if rows < 5 or cols < 5:
            raise ValueError(f"dim_room={tuple(self.dim_room)} is too small: rows and cols must be >= 5")
        interior = (rows - 2) * (cols - 2)
        if self.num_boxes < 1:
            raise ValueError(f"num_boxes={self.num_boxes} must be >= 1")
        if self.num_boxes + 1 >= interior:
            raise ValueError(
                f"num_boxes={self.num_boxes} does not fit dim_room={tuple(self.dim_room)}: "
                f"boxes + player must be fewer than the {interior} interior floor cells"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        if self.search_depth < 2:
            raise ValueError(f"search_depth={self.search_depth} must be >= 2")
        if self.num_gen_steps is not None and self.num_gen_steps < 1:
            raise ValueError(f"num_gen_steps={self.num_gen_steps} must be >= 1 (or None)")
        if not 0.0 <= self.p_change_direction <= 1.0:
            raise ValueError(f"p_change_direction={self.p_change_direction} must be in [0, 1]")
        for name in ("reverse_beam", "max_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_search_steps is not None and self.max_search_steps < 1:
            raise ValueError(f"max_search_steps={self.max_search_steps} must be >= 1 (or None)")
        if not 0.0 <= self.tie_swap <= 1.0:
            raise ValueError(f"tie_swap={self.tie_swap} must be in [0, 1]")

    @property
    def gen_steps(self) -> int:
        if self.num_gen_steps is not None:
            return self.num_gen_steps
        return int(1.7 * (self.dim_room[0] + self.dim_room[1]))

    @property
    def search_steps(self) -> int:
        # gym-sokoban's DFS starts with ttl=search_depth and stops at ttl<=0: depth-1 moves.
        cap = self.max_search_steps
        if cap is None:
            cap = max(4, (self.dim_room[0] - 2) * (self.dim_room[1] - 2) - 6)
        return min(self.search_depth - 1, cap)


SIMPLE_SOKOBAN = SokobanParams(dim_room=(6, 6), num_boxes=1, max_steps=100, search_depth=300)
LARGER_SOKOBAN = SokobanParams(dim_room=(8, 8), num_boxes=2, max_steps=100, search_depth=10)


@struct.dataclass
class SokobanState:
    room_fixed: jax.Array  # int32[R, C]: 0 wall, 1 floor, 2 target
    room_state: jax.Array  # int32[R, C]: gym-sokoban codes 0..5
    player: jax.Array  # int32[2]
    boxes_on_target: jax.Array  # int32
    step_count: jax.Array  # int32
    done: jax.Array  # bool
    success: jax.Array  # bool
