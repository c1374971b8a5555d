"""Batched stepping with automatic resets that only pay for the environments that ended.

The usual `jnp.where(done, reset(...), state)` under `vmap` generates a fresh level for every
environment at every step. Here finished environments are gathered (up to
`resets_per_step` of them per step) and only those are regenerated; any others stay
finished for one more step (a no-op) and are refilled on the next.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.envs.base import Environment


def make_auto_reset_step(env: Environment, params, resets_per_step: int):
    """Returns step(key, states, actions) -> (states, rewards, dones, infos) for a batch."""

    def step(key, states, actions):
        batch = actions.shape[0]
        k_step, k_reset = jax.random.split(key)
        states, rewards, dones, infos = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, batch), states, actions, params
        )

        def refill(states):
            lanes = jnp.nonzero(states.done, size=resets_per_step, fill_value=batch)[0]
            fresh = env.reset_batch(jax.random.split(k_reset, resets_per_step), params)
            return jax.tree.map(lambda old, new: old.at[lanes].set(new, mode="drop"), states, fresh)

        states = jax.lax.cond(states.done.any(), refill, lambda s: s, states)
        return states, rewards, dones, infos

    return step
