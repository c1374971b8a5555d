"""Batched stepping with automatic resets that pay for one fresh level per finished episode.

The usual `jnp.where(done, reset(key), state)` under `vmap` generates a level for every
environment at every step, although only a few finish. Here fresh episodes come from a
ring-buffer pool: each finished environment takes the next fresh episode from the pool, and
when fewer than `batch` fresh ones remain (so that even a step where everything finishes is
covered) the pool is topped up with `refill` newly generated episodes in one batched call.
Level generation then costs one level per finished episode, generated in large batches.

    auto = AutoReset(env, params, batch=1024)
    carry = auto.init(key)
    carry, rewards, dones, infos = auto.step(carry, actions)   # carry.envs: the live batch
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ragen_jax.envs.base import Environment


@struct.dataclass
class AutoResetState:
    envs: Any  # the batch being played: env states with a leading [batch] axis
    pool: Any  # [batch + refill] env states: fresh episodes in a ring
    next_fresh: jax.Array  # int32: ring index of the next unused fresh episode
    num_fresh: jax.Array  # int32: how many unused fresh episodes follow it
    key: jax.Array  # the source of every later random draw (steps and refills)


class AutoReset:
    """`init(key)` and `step(carry, actions)` for `batch` environments; both jit."""

    def __init__(self, env: Environment, params: Any, batch: int, refill: int | None = None):
        refill = batch if refill is None else refill
        if batch < 1 or refill < 1:
            raise ValueError(f"batch={batch} and refill={refill} must both be >= 1")
        self.env, self.params, self.batch, self.refill = env, params, batch, refill
        self.pool_size = batch + refill

    def init(self, key: jax.Array) -> AutoResetState:
        k_reset, key = jax.random.split(key)
        # One generation call (one compiled generator) for the batch and the full pool.
        episodes = self.env.reset_batch(jax.random.split(k_reset, self.batch + self.pool_size), self.params)
        return AutoResetState(
            envs=jax.tree.map(lambda a: a[: self.batch], episodes),
            pool=jax.tree.map(lambda a: a[self.batch :], episodes),
            next_fresh=jnp.int32(0),
            num_fresh=jnp.int32(self.pool_size),
            key=key,
        )

    def step(self, carry: AutoResetState, actions: jax.Array):
        """Steps every environment; the finished ones start a fresh episode at once.

        Returns (carry, rewards, dones, infos) where rewards/dones/infos describe the step
        just taken (`dones[i]` means env i's episode ended and it now holds a fresh one).
        """
        key, k_step, k_refill = jax.random.split(carry.key, 3)
        envs, rewards, dones, infos = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, self.batch), carry.envs, actions, self.params
        )
        # The i-th finished env (in lane order) takes the i-th next fresh episode.
        finished = envs.done
        slots = (carry.next_fresh + jnp.cumsum(finished) - 1) % self.pool_size
        envs = jax.tree.map(
            lambda fresh, old: jnp.where(_expand(finished, old), fresh[slots], old), carry.pool, envs
        )
        used = finished.sum(dtype=jnp.int32)
        carry = carry.replace(
            envs=envs,
            next_fresh=(carry.next_fresh + used) % self.pool_size,
            num_fresh=carry.num_fresh - used,
            key=key,
        )
        return self._top_up(carry, k_refill), rewards, dones, infos

    def _top_up(self, carry: AutoResetState, key: jax.Array) -> AutoResetState:
        """Generates `refill` episodes at a time until a whole batch of fresh ones is ready."""

        def refill(state):
            carry, round_ = state
            fresh = self.env.reset_batch(jax.random.split(jax.random.fold_in(key, round_), self.refill), self.params)
            first = carry.next_fresh + carry.num_fresh
            slots = (first + jnp.arange(self.refill)) % self.pool_size
            pool = jax.tree.map(lambda p, f: p.at[slots].set(f), carry.pool, fresh)
            return carry.replace(pool=pool, num_fresh=carry.num_fresh + self.refill), round_ + 1

        carry, _ = jax.lax.while_loop(lambda s: s[0].num_fresh < self.batch, refill, (carry, jnp.int32(0)))
        return carry


def _expand(mask: jax.Array, like: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (like.ndim - 1))
