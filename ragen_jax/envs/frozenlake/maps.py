"""FrozenLake's maps: the static parameters, the state of an episode, and maps generated inside jit.

Maps are `size`×`size`, each cell frozen with probability `p`, with random distinct start
and goal cells; a map with no path from start to goal is thrown away and resampled,
checked by a flood fill inside the same `lax.while_loop`. A fixed gymnasium-style `desc`
(rows of S/F/H/G) replaces generation when given.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.envs.coordinates import RENDER_FORMATS

DESC_LETTERS = "SFHG"


@struct.dataclass
class FrozenLakeParams:
    """Static settings (they fix array shapes, so jit specialises on them)."""

    size: int = struct.field(pytree_node=False, default=4)
    p: float = struct.field(pytree_node=False, default=0.8)  # probability a cell is frozen
    success_rate: float = struct.field(pytree_node=False, default=1.0 / 3.0)
    max_steps: int = struct.field(pytree_node=False, default=100)
    # A fixed map as gymnasium writes it, e.g. ("SFFF", "FHFH", "FFFH", "HFFG"); `size` follows it.
    desc: tuple[str, ...] | None = struct.field(pytree_node=False, default=None)
    # the observation text: "grid" (the board's symbols) or "grid_coord" (lines listing the
    # goal's, holes' and player's cells, then the grid)
    render_format: str = struct.field(pytree_node=False, default="grid")

    def __post_init__(self):
        if self.render_format not in RENDER_FORMATS:
            raise ValueError(f"render_format={self.render_format!r} is not one of {', '.join(RENDER_FORMATS)}")
        if self.desc is not None:
            desc = tuple(self.desc)
            _check_desc(desc)
            object.__setattr__(self, "desc", desc)
            object.__setattr__(self, "size", len(desc))
        if self.size < 2:
            raise ValueError(f"size={self.size} must be >= 2 (start and goal need distinct cells)")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"p={self.p} must be in (0, 1]")
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError(f"success_rate={self.success_rate} must be in [0, 1]")
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")


def _check_desc(desc: tuple[str, ...]) -> None:
    rows = len(desc)
    if rows < 2 or any(len(row) != rows for row in desc):
        raise ValueError(f"desc={desc!r} must be a square map of at least 2 rows of equal length")
    text = "".join(desc)
    bad = sorted(set(text) - set(DESC_LETTERS))
    if bad:
        raise ValueError(f"desc has letter {bad[0]!r}; allowed: S (start), F (frozen), H (hole), G (goal)")
    if text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"desc={desc!r} must have exactly one S and one G")


@struct.dataclass
class FrozenLakeState:
    holes: jax.Array  # bool[size, size]
    start: jax.Array  # int32[2]
    goal: jax.Array  # int32[2]
    player: jax.Array  # int32[2]
    step_count: jax.Array  # int32
    done: jax.Array  # bool
    success: jax.Array  # bool


def reachable(holes: jax.Array, start: jax.Array) -> jax.Array:
    """bool[size, size]: cells reachable from `start` through non-hole cells (flood fill)."""
    free = ~holes
    seed = jnp.zeros_like(holes).at[start[0], start[1]].set(True)

    def grow(carry):
        region, _ = carry
        padded = jnp.pad(region, 1)
        neighbours = padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]
        grown = region | (neighbours & free)
        return grown, (grown != region).any()

    region, _ = jax.lax.while_loop(lambda c: c[1], grow, (seed, jnp.bool_(True)))
    return region


def sample_map(key: jax.Array, size: int, p: float):
    """One candidate map: holes, start and goal (distinct, never holes); maybe unsolvable."""
    k_cells, k_start, k_goal = jax.random.split(key, 3)
    frozen = jax.random.uniform(k_cells, (size, size)) < p
    # A uniform pair of distinct cells: the goal is drawn from the cells other than the start.
    start = jax.random.randint(k_start, (), 0, size * size)
    goal = jax.random.randint(k_goal, (), 0, size * size - 1)
    goal = goal + (goal >= start)
    start = jnp.stack([start // size, start % size]).astype(jnp.int32)
    goal = jnp.stack([goal // size, goal % size]).astype(jnp.int32)
    holes = (~frozen).at[start[0], start[1]].set(False).at[goal[0], goal[1]].set(False)
    return holes, start, goal


def generate_map(key: jax.Array, params: FrozenLakeParams):
    """A solvable map: try t uses fold_in(key, t), so the same key gives the same map."""
    if params.desc is not None:
        grid = np.array([list(row) for row in params.desc])
        start = np.argwhere(grid == "S")[0].astype(np.int32)
        goal = np.argwhere(grid == "G")[0].astype(np.int32)
        return jnp.asarray(grid == "H"), jnp.asarray(start), jnp.asarray(goal)

    def attempt(t):
        holes, start, goal = sample_map(jax.random.fold_in(key, t), params.size, params.p)
        return holes, start, goal, reachable(holes, start)[goal[0], goal[1]]

    def retry(carry):
        t = carry[0] + 1
        return (t, *attempt(t))

    _, holes, start, goal, _ = jax.lax.while_loop(lambda c: ~c[4], retry, (jnp.int32(0), *attempt(0)))
    return holes, start, goal
