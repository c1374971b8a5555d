"""gym-sokoban's procedural level generator in pure JAX (docs/method.md#sokoban).

Three stages, as gym-sokoban's:
1. topology: a random walk of `num_gen_steps` steps stamping 3×3 floor masks;
2. placement: the player and `num_boxes` targets on distinct random floor cells, every box
   starting on its own target (the solved state);
3. reverse play: from the solved state, move backwards with "pull" moves and keep the state
   that maximises `pulls × Σ|box − its target|₁` (0 while any target is covered by a box or
   the player). gym-sokoban does this with a recursive depth-first search; here a small beam
   of distinct states is expanded by all eight reverse actions per round inside a `scan`,
   which finds levels as hard as gym-sokoban's (tests compare the mean optimal solution
   length of both generators, measured by the same BFS solver).
A try whose best score is 0 is thrown away and the whole level regenerated, as gym-sokoban
does; `lax.while_loop` keeps that inside jit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.sokoban.board import BOX, BOX_ON_TARGET, MOVES, PLAYER, TARGET, SokobanParams

# gym-sokoban's random-walk directions and 3×3 floor masks.
WALK_DIRECTIONS = np.array([(1, 0), (0, 1), (-1, 0), (0, -1)], dtype=np.int32)
FLOOR_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=np.int32,
)
# Each mask as a 9-bit number, bit 3 * row + col set where the mask has floor.
FLOOR_MASK_BITS = (FLOOR_MASKS.reshape(len(FLOOR_MASKS), 9) << np.arange(9)).sum(1).astype(np.int32)


def room_topology(key: jax.Array, params: SokobanParams) -> jax.Array:
    """gym-sokoban's random-walk room: int32[R, C] with 1 = floor, 0 = wall.

    All random draws are made up front; only the clipped walk itself is a (tiny) scan, and
    the 3×3 masks are stamped by comparing every cell with every step's centre.
    """
    rows, cols = params.dim_room
    steps = params.gen_steps
    k_dir, k_row, k_col, k_change, k_new_dir, k_mask = jax.random.split(key, 6)
    # The walk's direction: a new random one at each step where it changes (p = 0.35).
    changes = jax.random.uniform(k_change, (steps,)) < params.p_change_direction
    new_dirs = jax.random.randint(k_new_dir, (steps,), 0, 4)
    last_change = jax.lax.cummax(jnp.where(changes, jnp.arange(steps), -1))
    dir_ids = jnp.where(last_change >= 0, new_dirs[jnp.maximum(last_change, 0)], jax.random.randint(k_dir, (), 0, 4))
    moves = jnp.asarray(WALK_DIRECTIONS)[dir_ids]
    # gym-sokoban starts anywhere in [1, dim-1] and clamps to [1, dim-2] after each move.
    position = jnp.stack([jax.random.randint(k_row, (), 1, rows), jax.random.randint(k_col, (), 1, cols)])
    low, high = jnp.array([1, 1]), jnp.array([rows - 2, cols - 2])

    def walk(position, move):
        position = jnp.clip(position + move, low, high)
        return position, position

    _, centres = jax.lax.scan(walk, position, moves)
    mask_bits = jnp.asarray(FLOOR_MASK_BITS)[jax.random.randint(k_mask, (steps,), 0, len(FLOOR_MASKS))]
    d_row = jnp.arange(rows)[None, :, None] - centres[:, 0, None, None]
    d_col = jnp.arange(cols)[None, None, :] - centres[:, 1, None, None]
    bit = jnp.clip((d_row + 1) * 3 + (d_col + 1), 0, 8)
    stamped = (jnp.abs(d_row) <= 1) & (jnp.abs(d_col) <= 1) & ((mask_bits[:, None, None] >> bit) & 1 == 1)
    interior = jnp.zeros((rows, cols), bool).at[1:-1, 1:-1].set(True)
    return (stamped.any(0) & interior).astype(jnp.int32)


def place_player_and_targets(key: jax.Array, floor: jax.Array, num_boxes: int):
    """Distinct uniformly random floor cells: the player's, then one per target.

    Ranking cells by uniform noise is a uniform random permutation of the floor cells,
    the same distribution as gym-sokoban's sequential draws without replacement.
    Returns (player int32[2], targets int32[num_boxes, 2], enough_floor bool).
    """
    rows, cols = floor.shape
    noise = jax.random.uniform(key, (rows * cols,))
    noise = jnp.where(floor.ravel() > 0, noise, -1.0)
    _, flat = jax.lax.top_k(noise, num_boxes + 1)
    cells = jnp.stack([flat // cols, flat % cols], axis=-1).astype(jnp.int32)
    enough_floor = floor.sum() > num_boxes + 1  # gym-sokoban's own requirement
    return cells[0], cells[1:], enough_floor


def _score(player, boxes, pulls, targets):
    """gym-sokoban's level score: pulls × Σ|box − its target|₁, and 0 while any target is
    covered (by a box or by the player), so no level starts partly solved."""
    displacement = jnp.abs(boxes - targets).sum()
    box_on_target = (boxes[:, None, :] == targets[None, :, :]).all(-1).any()
    player_on_target = (player[None, :] == targets).all(-1).any()
    return jnp.where(box_on_target | player_on_target, 0, pulls * displacement)


def _reverse_move(player, boxes, pulls, delta, pull, walls):
    """The player steps onto free floor; a pull also drags the box behind it along."""
    nxt = player + delta
    can_move = ~walls[nxt[0], nxt[1]] & ~(boxes == nxt).all(-1).any()
    dragged = (boxes == player - delta).all(-1) & can_move & pull
    boxes = jnp.where(dragged[:, None], player[None, :], boxes)
    pulls = pulls + dragged.any().astype(jnp.int32)
    return jnp.where(can_move, nxt, player), boxes, pulls


def reverse_play(key, walls, targets, player, params: SokobanParams):
    """Search pull moves from the solved state for the best-scoring start state.

    A beam of `reverse_beam` distinct states is expanded by all eight reverse actions
    (four directions, with or without pulling) for `search_steps` rounds; each round keeps
    the best distinct states (ranked by score, then by the score ignoring covered targets
    so that boxes get pulled off their targets first, then by noise for variety). Returns
    the best (score, player, boxes) seen.
    """
    rows, cols = walls.shape
    width = params.reverse_beam
    moves = jnp.asarray(MOVES)
    deltas = jnp.repeat(moves, 2, axis=0)  # 8 reverse actions: (direction, pull)
    pulls_flag = jnp.tile(jnp.array([False, True]), 4)

    def state_key(player, boxes):
        cells = jnp.concatenate([player[None], boxes])
        cells = cells[:, 0] * cols + cells[:, 1]
        return (cells * jnp.asarray((rows * cols) ** np.arange(cells.shape[0]), jnp.int32)).sum()

    def expand(carry, xs):
        players, boxes, pulls, alive, best = carry
        noise, swap_draw = xs
        move = jax.vmap(jax.vmap(_reverse_move, (None, None, None, 0, 0, None)), (0, 0, 0, None, None, None))
        c_players, c_boxes, c_pulls = move(players, boxes, pulls, deltas, pulls_flag, walls)
        c_players = c_players.reshape(-1, 2)
        c_boxes = c_boxes.reshape(-1, *boxes.shape[1:])
        c_pulls = c_pulls.reshape(-1)
        c_alive = jnp.repeat(alive, 8)
        score = jax.vmap(_score, (0, 0, 0, None))(c_players, c_boxes, c_pulls, targets)
        raw = c_pulls * jnp.abs(c_boxes - targets).sum((1, 2))
        rank = score * 1024.0 + raw + noise
        rank = jnp.where(c_alive, rank, -1.0)
        # Keep one copy of each distinct state, the best-ranked one: candidates are hashed
        # into slots and only each slot's best survives (a rare collision merely drops one).
        slot = jax.vmap(state_key)(c_players, c_boxes) % (8 * width)
        slot_best = jax.ops.segment_max(rank, slot, num_segments=8 * width)
        rank = jnp.where(rank == slot_best[slot], rank, -1.0)
        top_rank, keep = jax.lax.top_k(rank, width)

        # The best state so far; a state scoring the same as the best replaces it with
        # probability `tie_swap` (variety without drifting to the deepest ties).
        tie_break = jnp.where(c_alive, score + 0.5 * noise, -1.0)
        cand = jnp.argmax(tie_break)
        best_score, best_player, best_boxes = best
        swap = (score[cand] == best_score) & (swap_draw < params.tie_swap)
        better = (score[cand] > best_score) | swap
        best = (
            jnp.where(better, score[cand], best_score),
            jnp.where(better, c_players[cand], best_player),
            jnp.where(better, c_boxes[cand], best_boxes),
        )
        return (c_players[keep], c_boxes[keep], c_pulls[keep], top_rank >= 0, best), None

    players = jnp.broadcast_to(player, (width, 2))
    boxes = jnp.broadcast_to(targets, (width, *targets.shape))
    alive = jnp.zeros(width, bool).at[0].set(True)
    best = (jnp.int32(0), player, targets)
    carry = (players, boxes, jnp.zeros(width, jnp.int32), alive, best)
    # All the search's random draws at once: noise to rank candidates, and tie-swap coins.
    k_noise, k_swap = jax.random.split(key)
    noise = jax.random.uniform(k_noise, (params.search_steps, 8 * width))
    swap_draws = jax.random.uniform(k_swap, (params.search_steps,))
    (_, _, _, _, best), _ = jax.lax.scan(expand, carry, (noise, swap_draws))
    return best


def generate_level_once(key: jax.Array, params: SokobanParams):
    """One generation try: returns (room_fixed, room_state, player, score)."""
    k_topology, k_place, k_walks = jax.random.split(key, 3)
    floor = room_topology(k_topology, params)
    player, targets, enough_floor = place_player_and_targets(k_place, floor, params.num_boxes)
    walls = floor == 0
    score, player, boxes = reverse_play(k_walks, walls, targets, player, params)
    score = jnp.where(enough_floor, score, 0)

    room_fixed = floor.at[targets[:, 0], targets[:, 1]].set(TARGET)
    box_codes = jnp.where(room_fixed[boxes[:, 0], boxes[:, 1]] == TARGET, BOX_ON_TARGET, BOX)
    room_state = room_fixed.at[boxes[:, 0], boxes[:, 1]].set(box_codes)
    room_state = room_state.at[player[0], player[1]].set(PLAYER)
    return room_fixed, room_state, player, score


def generate_level(key: jax.Array, params: SokobanParams):
    """Regenerate until a try scores above 0 (gym-sokoban's retry), at most `max_tries` times.

    Try t uses `fold_in(key, t)`, so a level depends on its key alone; `generate_levels`
    relies on that to give the same level for a key as this function.
    """

    def attempt(carry):
        tries, _ = carry
        return tries + 1, generate_level_once(jax.random.fold_in(key, tries), params)

    def failed(carry):
        tries, (_, _, _, score) = carry
        return (score <= 0) & (tries < params.max_tries)

    _, (room_fixed, room_state, player, _) = jax.lax.while_loop(failed, attempt, attempt((jnp.int32(0), None)))
    return room_fixed, room_state, player


def generate_levels(keys: jax.Array, params: SokobanParams):
    """`generate_level` for a batch of keys, with retries only for the levels that need them.

    Under `vmap`, a while-loop runs every lane until the slowest finishes, so a 12% failure
    rate per try would regenerate the whole batch three or four times. Here the failed
    levels are gathered into an eighth-size batch and retried there, lane by lane with the
    same `fold_in(key, try)` schedule, so the result equals `vmap(generate_level)` exactly.
    (One retry stage, not several sizes: each stage is another compiled copy of the generator.)
    (Levels that fail every one of `max_tries` tries keep their last, score-0 try.)
    """
    batch = keys.shape[0]
    once = jax.vmap(lambda k, t: generate_level_once(jax.random.fold_in(k, t), params))
    levels = once(keys, jnp.zeros(batch, jnp.int32))
    tries = jnp.ones(batch, jnp.int32)

    def pending(levels, tries):
        return (levels[3] <= 0) & (tries < params.max_tries)

    def retry(carry, size):
        levels, tries = carry
        lanes = jnp.nonzero(pending(levels, tries), size=size, fill_value=batch)[0]
        safe = jnp.minimum(lanes, batch - 1)
        fresh = once(keys[safe], tries[safe])
        levels = jax.tree.map(lambda old, new: old.at[lanes].set(new, mode="drop"), levels, fresh)
        return levels, tries.at[lanes].add(1, mode="drop")

    # The failed levels (about 12%) are retried in batches of an eighth: usually two rounds.
    size = max(1, min(batch, max(16, batch // 8)))
    levels, _ = jax.lax.while_loop(lambda c: pending(*c).any(), lambda c: retry(c, size), (levels, tries))
    return levels[:3]
