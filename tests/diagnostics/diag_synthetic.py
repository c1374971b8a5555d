"""Hand-built `Trajectories` for the diagnostics tests: a known buffer layout, no env or model."""

import jax.numpy as jnp
import numpy as np

from ragen_jax.rollout.layout import BufferLayout
from ragen_jax.rollout.play import Trajectories


def build(system, rows, obs_len, gen_len):
    """rows[b] = [(obs_ids, gen_ids, reasoning_length), ...] for the turns trajectory b played.

    Layout as the rollout's: [system | obs (obs_len, ids packed first) | gen (gen_len) | ...];
    turns a trajectory did not play are all holes.
    """
    batch, turns = len(rows), max(len(r) for r in rows)
    layout = BufferLayout(system=len(system), observation=obs_len, generation=gen_len, turns=turns)
    length = layout.length
    tokens = np.zeros((batch, length), np.int32)
    mask = np.zeros((batch, length), bool)
    tokens[:, : len(system)], mask[:, : len(system)] = system, True
    active = np.zeros((batch, turns), bool)
    gen_lengths = np.zeros((batch, turns), np.int32)
    reasoning = np.zeros((batch, turns), np.int32)
    offsets = layout.generation_offsets
    for b, row in enumerate(rows):
        for t, (obs, gen, r) in enumerate(row):
            assert 0 < len(obs) <= obs_len and len(gen) <= gen_len and r <= len(gen)
            o = offsets[t] - obs_len
            tokens[b, o : o + len(obs)], mask[b, o : o + len(obs)] = obs, True
            tokens[b, offsets[t] : offsets[t] + len(gen)], mask[b, offsets[t] : offsets[t] + len(gen)] = gen, True
            active[b, t], gen_lengths[b, t], reasoning[b, t] = True, len(gen), r
    zeros = lambda shape, dtype=np.float32: jnp.zeros(shape, dtype)
    return Trajectories(
        tokens=jnp.asarray(tokens), mask=jnp.asarray(mask), loss_mask=zeros((batch, length), bool),
        logprobs=zeros((batch, length)), token_rewards=zeros((batch, length)), episode_reward=zeros(batch),
        success=zeros(batch, bool), num_actions=zeros(batch, np.int32), turn_active=jnp.asarray(active),
        turn_valid=jnp.asarray(active), turn_reward=zeros((batch, turns)),
        turn_actions=zeros((batch, turns, 1), np.int32), gen_lengths=jnp.asarray(gen_lengths),
        reasoning_lengths=jnp.asarray(reasoning), layout=layout,
    )


def random_rows(rng, num_groups, group_size, turns, obs_len, gen_len, vocab=(3, 900)):
    """Random text: a group shares its first observation; random turn counts, lengths and
    reasoning lengths (0 included: no reasoning)."""
    rows = []
    for g in range(num_groups):
        first_obs = rng.integers(*vocab, rng.integers(1, obs_len + 1))
        for _ in range(group_size):
            row = []
            for t in range(rng.integers(1, turns + 1)):
                obs = first_obs if t == 0 else rng.integers(*vocab, rng.integers(1, obs_len + 1))
                gen = rng.integers(*vocab, rng.integers(0, gen_len + 1))
                row.append((obs, gen, int(rng.integers(0, len(gen) + 1))))
            rows.append(row)
    return rows
