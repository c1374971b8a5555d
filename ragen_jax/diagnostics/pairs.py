"""The (x, z) pair sets of docs/method.md#pairs, located in a rollout's token buffer.

A rollout row is one fixed buffer `[system | turn 1 obs | turn 1 gen | turn 2 obs | ...]`
(`Trajectories`, laid out by `traj.layout`); turn t's generation starts at the static slot
`layout.generation_offset(t)`. For a (trajectory b, turn t):

- x = the valid slots of row b before `generation_offset(t)` (the observation chunk ends with the
  `<think>` prefix). Prompts keep the buffer layout, holes included: the cross-scorers skip
  holes and count RoPE positions over valid slots only.
- z = the first `reasoning_lengths[b, t]` generated tokens (everything before `</think>`).
- a = the answer: the generated tokens after the reasoning, from the token holding `</think>`
  to the end of the generation (`gen_lengths[b, t]`), at most `answer_tokens` of them.

A `PairSet` only records indices (which trajectory and turn each sample and each column come
from); `prompts` and `samples` gather the tokens. Everything is jittable with static shapes.

Sampling (decisions, see docs/architecture.md):
- Trajectories are drawn *without* replacement: M = min(num_samples, B) distinct rows. No
  sample is scored twice, and two samples never share one trajectory's history.
- first-turn pairs: columns = the groups (N = B / group_size, the prompt of the group's first
  member, which every member shares), rows = M random trajectories' first turns.
- trajectory pairs: M random trajectories, then for each a turn uniformly among the turns it
  played; every sample is its own column (N = M).
- per-turn pairs (turn t): trajectories still active at t, drawn without replacement, every
  sample its own column. Group columns are not used: after the first action the members of a
  group no longer share a state, so a group has no single prompt at t > 0. When fewer than
  `num_samples` trajectories are active at t, the drawn ones are repeated (cycled) to fill the
  static shape: the repeats are flagged `drawn=False` (never scored as rows), but stay as
  columns — identical prompts, so they count as one equivalent column for retrieval, and the
  marginal over columns weighs each real sample about equally (the marginal runs over all
  columns, duplicates included). No trajectory active at t: every row invalid, metrics 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class PairSet:
    """M samples (rows) and N prompt columns, as (trajectory, turn) indices into a batch."""

    rows: jax.Array  # int32[M] trajectory of each sample
    turns: jax.Array  # int32[M] turn of each sample
    drawn: jax.Array  # bool[M] a real draw (False: a repeat filling the static shape)
    valid: jax.Array  # bool[M] drawn, and the reasoning is not empty (mi_metrics' `valid`)
    true_column: jax.Array  # int32[M] the column each sample was drawn from
    column_rows: jax.Array  # int32[N] trajectory whose buffer holds column j's prompt
    column_turns: jax.Array  # int32[N] the prompt is that buffer before generation_offset(turn)
    prompt_width: int = struct.field(pytree_node=False, default=0)  # P: slots any prompt may use


@struct.dataclass
class Samples:
    """The generations of a PairSet's rows, left-aligned at the turn's generation slot."""

    tokens: jax.Array  # int32[M, G] the turn's generated slots (reasoning first, then the answer)
    reasoning_mask: jax.Array  # bool[M, G] the first `reasoning_lengths` slots (z)
    answer_mask: jax.Array  # bool[M, G] the answer slots (a), capped at `answer_tokens`
    answer: jax.Array  # int32[M, A] the answer alone, left-aligned
    answer_only_mask: jax.Array  # bool[M, A]


def _offsets(traj) -> jax.Array:
    return jnp.asarray(traj.layout.generation_offsets, jnp.int32)


def _random_subset(key: jax.Array, candidates: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """`size` indices drawn uniformly without replacement among `candidates` (bool[B]), in random
    order; when fewer exist, the draws are repeated cyclically. Returns (indices, drawn)."""
    priority = jnp.where(candidates, jax.random.uniform(key, candidates.shape), -1.0)
    _, order = jax.lax.top_k(priority, size)  # candidates first, in random order
    count = candidates.sum().astype(jnp.int32)
    slot = jnp.arange(size)
    picked = order[slot % jnp.maximum(count, 1)]
    return picked.astype(jnp.int32), slot < count


def _num_samples(traj, num_samples: int) -> int:
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    return min(num_samples, traj.tokens.shape[0])


def first_turn_pairs(traj, key: jax.Array, num_samples: int, group_size: int) -> PairSet:
    """Columns = the groups (first turn of each group's first member); rows = min(num_samples, B)
    trajectories drawn without replacement, z = their first-turn reasoning."""
    batch = traj.tokens.shape[0]
    if group_size < 1 or batch % group_size:
        raise ValueError(f"group_size={group_size} must divide the batch of {batch} trajectories")
    m = _num_samples(traj, num_samples)
    rows, drawn = _random_subset(key, traj.turn_active[:, 0], m)
    num_groups = batch // group_size
    zeros_m, zeros_n = jnp.zeros(m, jnp.int32), jnp.zeros(num_groups, jnp.int32)
    return PairSet(
        rows=rows,
        turns=zeros_m,
        drawn=drawn,
        valid=drawn & (traj.reasoning_lengths[rows, 0] > 0),
        true_column=rows // group_size,
        column_rows=jnp.arange(num_groups, dtype=jnp.int32) * group_size,
        column_turns=zeros_n,
        prompt_width=traj.layout.generation_offset(0),
    )


def trajectory_pairs(traj, key: jax.Array, num_samples: int) -> PairSet:
    """min(num_samples, B) trajectories without replacement, each at a turn drawn uniformly
    among the turns it played; every sample is its own column."""
    m = _num_samples(traj, num_samples)
    k_rows, k_turns = jax.random.split(key)
    played = traj.turn_active.any(axis=1)
    rows, drawn = _random_subset(k_rows, played, m)
    active = traj.turn_active[rows]  # [M, T]
    priority = jnp.where(active, jax.random.uniform(k_turns, active.shape), -1.0)
    turns = jnp.argmax(priority, axis=1).astype(jnp.int32)  # uniform among the active turns
    return _own_columns(traj, rows, turns, drawn & active.any(axis=1))


def turn_pairs(traj, key: jax.Array, turn, num_samples: int) -> PairSet:
    """Turn `turn` (may be traced) of min(num_samples, B) trajectories active at that turn,
    drawn without replacement (cycled when fewer are active); each sample its own column."""
    m = _num_samples(traj, num_samples)
    turn = jnp.asarray(turn, jnp.int32)
    rows, drawn = _random_subset(key, traj.turn_active[:, turn], m)
    # A repeat's row is left out (not drawn); its column stays, identical to the original's.
    return _own_columns(traj, rows, jnp.full(m, turn, jnp.int32), drawn)


def _own_columns(traj, rows: jax.Array, turns: jax.Array, drawn: jax.Array) -> PairSet:
    """Samples (rows[i], turns[i]) each with its own prompt as column i."""
    return PairSet(rows=rows, turns=turns, drawn=drawn, valid=drawn & (traj.reasoning_lengths[rows, turns] > 0),
                   true_column=jnp.arange(rows.shape[0], dtype=jnp.int32), column_rows=rows, column_turns=turns,
                   prompt_width=traj.layout.generation_offset(traj.layout.turns - 1))


def prompts(traj, pairs: PairSet) -> tuple[jax.Array, jax.Array]:
    """(ids, mask) [N, P]: column j = the buffer of `column_rows[j]`, valid slots before its turn's
    generation offset, in the buffer layout (P = `pairs.prompt_width`)."""
    width = pairs.prompt_width
    ids = traj.tokens[pairs.column_rows, :width]
    ends = _offsets(traj)[pairs.column_turns]
    mask = traj.mask[pairs.column_rows, :width] & (jnp.arange(width)[None, :] < ends[:, None])
    return jnp.where(mask, ids, 0), mask


def samples(traj, pairs: PairSet, answer_tokens: int) -> Samples:
    """The generation of each row's turn: z (reasoning) and a (answer, at most `answer_tokens`)."""
    width = traj.layout.generation
    starts = _offsets(traj)[pairs.turns]  # [M]
    slots = starts[:, None] + jnp.arange(width)[None, :]
    tokens = jnp.take_along_axis(traj.tokens[pairs.rows], slots, axis=1)
    reasoning = traj.reasoning_lengths[pairs.rows, pairs.turns]
    generated = traj.gen_lengths[pairs.rows, pairs.turns]
    answer_end = jnp.minimum(generated, reasoning + answer_tokens)
    index = jnp.arange(width)[None, :]
    reasoning_mask = index < reasoning[:, None]
    answer_mask = (index >= reasoning[:, None]) & (index < answer_end[:, None])
    # the answer alone, left-aligned
    answer_index = reasoning[:, None] + jnp.arange(answer_tokens)[None, :]
    answer = jnp.take_along_axis(tokens, jnp.minimum(answer_index, width - 1), axis=1)
    answer_only_mask = answer_index < answer_end[:, None]
    return Samples(
        tokens=jnp.where(reasoning_mask | answer_mask, tokens, 0),
        reasoning_mask=reasoning_mask,
        answer_mask=answer_mask,
        answer=jnp.where(answer_only_mask, answer, 0),
        answer_only_mask=answer_only_mask,
    )
