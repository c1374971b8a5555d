"""FrozenLake in pure JAX: gymnasium's slippery-ice rules on maps generated inside jit.

Walk from the start to the goal without falling into a hole. With probability
`success_rate` the agent moves where it meant to; otherwise it slips to one of the two
perpendicular directions, each with half the remaining probability (gymnasium's
semantics: `success_rate=1/3` is the classic slippery lake, `1.0` is deterministic).
Moves are clipped at the border. Reaching the goal pays +1 and ends the episode; a hole
ends it with 0; `max_steps` ends it as a truncation (gymnasium's TimeLimit of 100).

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

from ragen_jax.envs.base import Environment, Info, format_cells, is_valid_action

# Action k (1-based) moves by MOVES[k - 1]: Left, Down, Right, Up (gymnasium's 0..3 plus one).
MOVES = np.array([(0, -1), (1, 0), (0, 1), (-1, 0)], dtype=np.int32)

# Symbol ids of the text grid.
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)

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

    def __post_init__(self):
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


# ---------------------------------------------------------------------------------------
# Map generation
# ---------------------------------------------------------------------------------------


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


def moves_into_holes(holes, cell) -> list[str]:
    """Host-side: names of the moves (in action order) that step from `cell` straight into a hole
    of the bool grid `holes` — what the warm start's reasoning names (ragen_jax.sft) and
    ragen_jax.analysis.reasoning_check checks against the board."""
    holes = np.asarray(holes, bool)
    rows, cols = holes.shape
    r, c = (int(x) for x in cell)
    return [name for name, (dr, dc) in zip(FrozenLake.action_names, MOVES)
            if 0 <= r + dr < rows and 0 <= c + dc < cols and holes[r + dr, c + dc]]


class FrozenLake(Environment):
    """Reach the goal on slippery ice. Transitions exactly as gymnasium's FrozenLake."""

    name = "frozenlake"
    action_names = ("Left", "Down", "Right", "Up")
    symbols = ("_", "O", "G", "P", "X", "√")
    render_formats = ("grid", "grid_coord")

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
        info: Info = {
            "success": new_state.success,
            "action_is_valid": valid,
            "action_is_effective": (player != state.player).any() & ~finished,
            "truncated": new_state.done & ~new_state.success & ~new_state.holes[new_state.player[0], new_state.player[1]],
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

    def coordinate_lines(self, state: FrozenLakeState, params: FrozenLakeParams) -> list[str]:
        goal, player = np.asarray(state.goal), np.asarray(state.player)
        return [
            f"Board size: {params.size} rows x {params.size} cols",
            f"Goal: ({goal[0]}, {goal[1]})",
            f"Holes: {format_cells(state.holes) or 'none'}",
            f"Player: ({player[0]}, {player[1]})",
        ]

    def instructions(self) -> str:
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. The ice "
            "is slippery: you may move in a direction perpendicular to the one you chose. "
            "The symbols are: _ frozen tile, O hole, G goal, P player, X player in a hole, "
            "√ player on the goal."
        )


FROZENLAKE = FrozenLake()
