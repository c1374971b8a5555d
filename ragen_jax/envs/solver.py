"""Breadth-first optimal solvers (plain NumPy/Python) for Sokoban and FrozenLake.

Tests use them to prove generated levels are solvable and to measure level difficulty
(optimal solution length); the supervised warm start uses their plans as demonstrations.
Actions are returned in each environment's own 1-based action numbering.
"""

from __future__ import annotations

from collections import deque

import numpy as np

# Sokoban actions 1..4 = Up, Down, Left, Right.
SOKOBAN_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
# FrozenLake actions 1..4 = Left, Down, Right, Up.
FROZENLAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))


def _corner_dead_cells(walls: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Non-target cells with walls on two orthogonal sides: a box pushed there never moves."""
    rows, cols = walls.shape
    dead = np.zeros_like(walls, dtype=bool)
    for r in range(1, rows - 1):
        for c in range(1, cols - 1):
            if walls[r, c] or targets[r, c]:
                continue
            vertical = walls[r - 1, c] or walls[r + 1, c]
            horizontal = walls[r, c - 1] or walls[r, c + 1]
            dead[r, c] = vertical and horizontal
    return dead


def solve_sokoban(walls, targets, boxes, player, max_states: int = 2_000_000) -> list[int] | None:
    """Shortest action sequence (1=Up, 2=Down, 3=Left, 4=Right) that puts every box on a target.

    Every action costs one step, pushes included, so the plan is optimal in moves, the
    quantity the environment's step penalty charges. Returns [] for a solved level and
    None when no solution exists (or the search exceeds `max_states`).
    """
    walls = np.asarray(walls, dtype=bool)
    targets = np.asarray(targets, dtype=bool)
    rows, cols = walls.shape
    target_set = frozenset(int(i) for i in np.flatnonzero(targets))
    dead = _corner_dead_cells(walls, targets).ravel()
    wall_flat = walls.ravel()
    start_boxes = tuple(sorted(int(i) for i in np.flatnonzero(np.asarray(boxes, dtype=bool))))
    start = (int(player[0]) * cols + int(player[1]), start_boxes)
    if set(start_boxes) <= target_set:
        return []
    offsets = [dr * cols + dc for dr, dc in SOKOBAN_MOVES]
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pos, box_tuple = state
        box_set = set(box_tuple)
        for action, off in enumerate(offsets, start=1):
            nxt = pos + off
            if wall_flat[nxt]:
                continue
            new_boxes = box_tuple
            if nxt in box_set:
                beyond = nxt + off
                if wall_flat[beyond] or beyond in box_set or dead[beyond]:
                    continue
                new_boxes = tuple(sorted((box_set - {nxt}) | {beyond}))
            child = (nxt, new_boxes)
            if child in parent:
                continue
            parent[child] = (state, action)
            if new_boxes is not box_tuple and set(new_boxes) <= target_set:
                return _unwind(parent, child)
            if len(parent) > max_states:
                return None
            queue.append(child)
    return None


def solve_frozenlake(holes, start, goal) -> list[int] | None:
    """Shortest action sequence (1=Left, 2=Down, 3=Right, 4=Up) from start to goal avoiding holes,
    as if the lake were not slippery. None when the goal cannot be reached."""
    holes = np.asarray(holes, dtype=bool)
    size_r, size_c = holes.shape
    start, goal = (int(start[0]), int(start[1])), (int(goal[0]), int(goal[1]))
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return _unwind(parent, cell)
        for action, (dr, dc) in enumerate(FROZENLAKE_MOVES, start=1):
            nxt = (min(max(cell[0] + dr, 0), size_r - 1), min(max(cell[1] + dc, 0), size_c - 1))
            if nxt in parent or holes[nxt]:
                continue
            parent[nxt] = (cell, action)
            queue.append(nxt)
    return None


def _unwind(parent: dict, node) -> list[int]:
    actions = []
    while parent[node] is not None:
        node, action = parent[node]
        actions.append(action)
    return actions[::-1]
