"""Advantage estimators (docs/method.md#advantages): GAE with a critic, GRPO and Dr.GRPO group
baselines.

Token layout: every trajectory is one row of a token buffer, `mask` marks the generated
(assistant) tokens, and the episode reward sits on the last generated token. Observation and
padding slots between turns are outside the mask; GAE skips over them (they neither add a
step nor break the recursion), so a multi-turn trajectory is one sequence of decisions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

WHITEN_EPS = 1e-8
GROUP_STD_EPS = 1e-6


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    mask = mask.astype(x.dtype)
    return jnp.sum(x * mask, axis=axis) / jnp.maximum(jnp.sum(mask, axis=axis), 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """(x − mean) / sqrt(var + 1e-8) over the masked entries (unbiased variance, as verl)."""
    mask_f = mask.astype(x.dtype)
    count = jnp.sum(mask_f)
    mean = jnp.sum(x * mask_f) / jnp.maximum(count, 1.0)
    var = jnp.sum(jnp.square(x - mean) * mask_f) / jnp.maximum(count - 1.0, 1.0)
    return (x - mean) * jax.lax.rsqrt(var + WHITEN_EPS)


def gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float = 1.0, lam: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over the masked tokens of each row.

    rewards, values, mask: [B, T]. Walks each row backwards; a slot outside the mask passes
    the next value and the running advantage through unchanged. Returns (advantages, returns)
    [B, T], advantages whitened over the mask, returns = raw advantages + values.
    """
    mask_f = mask.astype(jnp.float32)
    rewards = rewards.astype(jnp.float32)
    values = values.astype(jnp.float32)

    def back(carry, xs):
        next_value, next_advantage = carry
        reward, value, valid = xs
        delta = reward + gamma * next_value - value
        advantage = delta + gamma * lam * next_advantage
        next_value = jnp.where(valid > 0, value, next_value)
        next_advantage = jnp.where(valid > 0, advantage, next_advantage)
        return (next_value, next_advantage), advantage

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    columns = (rewards.T, values.T, mask_f.T)
    _, advantages = jax.lax.scan(back, (zeros, zeros), columns, reverse=True)
    advantages = advantages.T * mask_f
    returns = advantages + values
    return masked_whiten(advantages, mask) * mask_f, returns


def group_advantages(scores: jax.Array, normalise_std: bool = True) -> jax.Array:
    """Per-trajectory advantages from episode rewards [G, N] (N trajectories per group).

    GRPO: (R − group mean) / (group std + 1e-6), std unbiased; Dr.GRPO (`normalise_std=False`):
    R − group mean, which keeps the scale of the reward and avoids favouring easy groups.
    """
    scores = scores.astype(jnp.float32)
    centred = scores - scores.mean(axis=1, keepdims=True)
    if not normalise_std:
        return centred
    return centred / (jnp.std(scores, axis=1, ddof=1, keepdims=True) + GROUP_STD_EPS)


def broadcast_to_tokens(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Trajectory advantages [B] onto their generated tokens [B, T] (0 elsewhere)."""
    return advantages[:, None] * mask.astype(jnp.float32)
