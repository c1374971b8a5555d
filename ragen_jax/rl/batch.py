"""The update's view of a rollout: generated slots gathered into compact [B, K] arrays.

The rollout buffer `[B, S]` has holes; the loss only concerns generated slots. Those sit at
static offsets (`traj.layout.generation_offset(t) + i`), so the update works on a compact
`[B, K]` view, K = turns × max_new_tokens: for each generated slot its token, the slot that
predicts it (the last valid slot before it), its loss mask, sampling-time log-prob and reward.
The training forward runs over the whole buffer once and projects to the vocabulary only at
those K slots. Shared by the train step, the gradient analysis and the supervised fit.

Every row starts with the same system prompt (`shared_prefix` slots). The forward runs it once,
for one row, and hands its keys and values to all rows (`backbone_hidden`): the same numbers
and gradients as a forward over every row's copy, for the cost of one (the tiny Sokoban
config's prompt is 139 of ~530 valid slots per row: ~20% of the update's forward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.models.cache import DecodeContext, init_cache, positions_from_mask
from ragen_jax.models.decoder import Decoder
from ragen_jax.models.head import token_logprobs
from ragen_jax.models.value import ValueModel
from ragen_jax.rollout.play import Trajectories


@struct.dataclass
class Batch:
    """The update's view of a rollout: rows [B], generated slots [B, K]."""

    tokens: jax.Array  # int32[B, S] whole buffer
    mask: jax.Array  # bool[B, S]
    query: jax.Array  # int32[B, K] slot whose output predicts each generated token
    targets: jax.Array  # int32[B, K]
    loss_mask: jax.Array  # bool[B, K]
    old_logprobs: jax.Array  # f32[B, K]
    rewards: jax.Array  # f32[B, K] the episode reward on the last generated token
    advantages: jax.Array  # f32[B, K]
    returns: jax.Array  # f32[B, K] (critic targets; 0 without a critic)
    old_values: jax.Array  # f32[B, K]
    # f32[B, K] the temperature each token was drawn at, when it varies (rollout.action_sampling);
    # None: the one `policy_logprobs` is given
    temperatures: jax.Array | None = None
    shared_prefix: int = struct.field(pytree_node=False, default=0)  # leading slots equal in every row, all valid


def generated_slots(traj: Trajectories) -> np.ndarray:
    """Static slot indices of every turn's generation window, K = turns × max_new_tokens."""
    layout = traj.layout
    return np.concatenate([np.arange(o, o + layout.generation) for o in layout.generation_offsets]).astype(np.int32)


def previous_valid_slot(mask: jax.Array) -> jax.Array:
    """int32[B, S]: the last valid slot strictly before each slot (0 when there is none)."""
    slots = jnp.arange(mask.shape[1], dtype=jnp.int32)
    last = jax.lax.cummax(jnp.where(mask, slots, -1), axis=1)
    return jnp.maximum(jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1), 0)


def batch_from_trajectories(traj: Trajectories) -> Batch:
    slots = generated_slots(traj)
    take = lambda a: a[:, slots]
    zeros = jnp.zeros(traj.tokens.shape[:1] + slots.shape, jnp.float32)
    return Batch(tokens=traj.tokens, mask=traj.mask, query=take(previous_valid_slot(traj.mask)),
                 targets=take(traj.tokens), loss_mask=take(traj.loss_mask), old_logprobs=take(traj.logprobs),
                 rewards=take(traj.token_rewards), advantages=zeros, returns=zeros, old_values=zeros,
                 temperatures=None if traj.temperatures is None else take(traj.temperatures),
                 shared_prefix=traj.layout.system)


def compact(batch: Batch, multiple: int = 64) -> Batch:
    """The same batch with each row's valid slots moved to the front, in order, and the
    buffer cut to the longest row (rounded up to `multiple`, so few widths compile).

    Exact: RoPE positions count valid slots only and attention is causal over valid slots, so
    the model sees the same text; `query` is remapped to the moved slots. Worth it where
    holes are many (a rollout buffer reserves `max_new_tokens` per turn and a slot for every
    turn an episode may not reach): FrozenLake's 5-turn demonstrations shrink from 982 slots
    to 544 on average and the supervised fit runs 2× faster (benchmarks/sft_fit_speed.py).
    Host-side (NumPy) with data-dependent width, so not for use under jit."""
    mask = np.asarray(batch.mask, bool)
    order = np.argsort(~mask, axis=1, kind="stable")  # valid slots first, order kept
    new_slot = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    width = max(int(mask.sum(axis=1).max()), 1)
    width = min(-(-width // multiple) * multiple, mask.shape[1])
    order = order[:, :width]
    return batch.replace(tokens=jnp.asarray(np.take_along_axis(np.asarray(batch.tokens), order, axis=1)),
                         mask=jnp.asarray(np.take_along_axis(mask, order, axis=1)),
                         query=jnp.asarray(np.take_along_axis(new_slot, np.asarray(batch.query), axis=1),
                                           jnp.int32))


def backbone_hidden(model: Decoder, batch: Batch, dropout_key: jax.Array | None = None) -> jax.Array:
    """Final hidden states [B, S, d] of the whole buffer. The shared prefix runs once, for the
    first row; the rest of every row attends to its keys/values (a `KVCache.shared` cache:
    one row read by all), exactly as it would to its own copy. With a LoRA dropout key
    (`Decoder.__call__`) every row runs whole: each row's prefix draws its own masks."""
    positions = positions_from_mask(batch.mask)
    p = batch.shared_prefix
    if p == 0 or (dropout_key is not None and model.cfg.lora.has_dropout):
        return model(batch.tokens, positions, batch.mask, dropout_key=dropout_key)[0]
    rows, slots = batch.tokens.shape
    prefix, cache = model(batch.tokens[:1, :p], positions[:1, :p], batch.mask[:1, :p],
                          DecodeContext(init_cache(model.cfg, 1, p), offset=0))
    cache = cache.replace(mask=jnp.zeros((rows, slots), bool).at[:, :p].set(cache.mask))
    rest, _ = model(batch.tokens[:, p:], positions[:, p:], batch.mask[:, p:], DecodeContext(cache, offset=p))
    return jnp.concatenate([jnp.broadcast_to(prefix, (rows,) + prefix.shape[1:]), rest], axis=1)


def policy_logprobs(model: Decoder, batch: Batch, temperature: float, dropout_key: jax.Array | None = None):
    """Log-probs and full-distribution entropies [b, K] of the generated tokens, under the
    policy at the sampling temperature (what the sampler's recorded log-probs measure):
    each token's own (`batch.temperatures`) when the batch has them, else `temperature`.
    `dropout_key`: the LoRA dropout's (a training forward, `backbone_hidden`), or None."""
    hidden = backbone_hidden(model, batch, dropout_key)
    picked = jnp.take_along_axis(hidden, batch.query[..., None], axis=1)
    if batch.temperatures is not None:
        picked = picked / batch.temperatures[..., None].astype(picked.dtype)  # logits / T, per token
    elif temperature != 1.0:
        picked = picked / jnp.asarray(temperature, picked.dtype)  # logits / T
    return token_logprobs(model, picked, batch.targets, with_entropy=True)


def critic_values(critic: ValueModel, batch: Batch, dropout_key: jax.Array | None = None) -> jax.Array:
    """V [b, K] at each generated token, read from the slot that predicts it (as verl);
    `dropout_key` as `policy_logprobs`'."""
    hidden = backbone_hidden(critic.backbone, batch, dropout_key)
    return critic.values(jnp.take_along_axis(hidden, batch.query[..., None], axis=1))
