"""Random rewards: the paper's stochasticity axis (`env.reward_noise`).

With probability q each finished episode's reward is replaced by the reward of an episode drawn
uniformly (with replacement) from the same batch; the other rewards are unchanged. Drawing from
the batch keeps the rewards' scale and support whatever the game (FrozenLake's 0/1, Sokoban's
shaped returns, format penalties) and makes a replaced reward carry no information about its
own trajectory: at q = 1 every reward is noise, at q = 0 the run is the noiseless one. Only
the learner sees the replaced rewards; success flags, logged returns and validation keep the
true outcome.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def randomize_rewards(key: jax.Array, rewards: jax.Array, q: float) -> tuple[jax.Array, jax.Array]:
    """(rewards with each replaced w.p. `q` by a uniformly drawn reward of the batch, the
    replaced mask); `rewards` is f32[B] of episode rewards."""
    k_replace, k_source = jax.random.split(key)
    replaced = jax.random.bernoulli(k_replace, q, rewards.shape)
    source = jax.random.randint(k_source, rewards.shape, 0, rewards.shape[0])
    return jnp.where(replaced, rewards[source], rewards), replaced
