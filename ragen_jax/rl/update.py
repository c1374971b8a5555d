"""The update as pure functions: advantages, then optimiser steps over the kept rows.

`Learner` holds what does not change during a run (the models' structure, the optimisers, the
algorithm, where rows live on the mesh); every function takes it with the arrays it works on
and returns new arrays. The optimiser steps run over the filter's kept rows only: a loop whose
trip count depends on how many groups were kept (`filter.update` sets the steps' windows), and
inside each step a loop over micro-batches that stops after the last one holding a loss token,
so dropped groups cost no compute (docs/architecture.md#filtering-saves-compute).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from ragen_jax.models import lora as lora_lib
from ragen_jax.rl import advantages as adv
from ragen_jax.rl import filtering, losses, rounding
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.batch import Batch, critic_values, policy_logprobs

# What each optimiser step reports; their means over the steps are the update's metrics.
UPDATE_STATS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/kl", "actor/clip_frac", "actor/approx_kl",
                "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")


@dataclasses.dataclass(frozen=True)
class Learner:
    """The update's static parts: the policy's (and PPO's critic's) structure, their
    optimisers, the algorithm, the sampling temperature the log-probs are taken at, and
    `rows`, which pins an array's rows across the mesh (identity without one). `lora`: the
    policy has LoRA adapters (models/lora.py): the optimisers hold and update only the adapters
    (and the critic's value head), the base weights pass through unchanged, and the KL
    reference is the policy with its adapters switched off (no reference state). `dropout`:
    the adapters have dropout (`LoraConfig.has_dropout`): the actor's and critic's loss forwards
    get PRNG keys (`optimise`), no other forward does."""

    policy_graph: Any
    critic_graph: Any
    actor_tx: optax.GradientTransformation
    critic_tx: optax.GradientTransformation
    algo: AlgoConfig
    temperature: float
    rows: Callable
    lora: bool = False
    dropout: bool = False

    def trained(self, params):
        """(the part of a model's state the optimiser updates, a function from that part back
        to the whole state): with LoRA the adapters (and a critic's head), else everything."""
        if not self.lora:
            return params, lambda t: t
        train, frozen = lora_lib.split_trainable(params)
        return train, lambda t: lora_lib.join(t, frozen)

    def opt_params(self, params):
        """What the optimiser state is shaped after (`optax` init): `trained(params)[0]`."""
        return self.trained(params)[0]


def token_entropy(learner: Learner, params, batch: Batch) -> jax.Array:
    """Policy entropy [B, K] at every generated slot, one minibatch at a time."""
    mb = learner.algo.mini_batch_size
    model = nnx.merge(learner.policy_graph, params)
    chunks = jax.tree.map(lambda a: split(a, mb), batch)
    entropy = jax.lax.map(lambda b: policy_logprobs(model, b, learner.temperature)[1], chunks)
    return entropy.reshape(batch.loss_mask.shape)


def advantages(learner: Learner, critic_state, batch: Batch, episode_reward, rows, group_size: int) -> Batch:
    """Fill advantages (and, for PPO, old values and returns) for the first `rows` rows
    (groups whole, in order): group baselines without a critic (GRPO and its variants), GAE
    with one (PPO), the critic run over those rows only, a minibatch at a time."""
    algo = learner.algo
    if not algo.uses_critic:
        rewards = episode_reward.reshape(-1, group_size)
        per_row = adv.group_advantages(rewards, normalise_std=algo.advantage == "grpo").reshape(-1)
        return batch.replace(advantages=adv.broadcast_to_tokens(per_row, batch.loss_mask))
    mb = algo.mini_batch_size
    critic = nnx.merge(learner.critic_graph, critic_state)

    def value_pass(i, values):
        v = critic_values(critic, learner.rows(jax.tree.map(lambda a: split(a, mb)[i], batch)))
        return split(values, mb).at[i].set(v).reshape(values.shape)

    values = jax.lax.fori_loop(0, (rows + mb - 1) // mb, value_pass, jnp.zeros_like(batch.rewards))
    mask = batch.loss_mask & (jnp.arange(batch.loss_mask.shape[0]) < rows)[:, None]
    gae_advantages, returns = adv.gae(batch.rewards, values, mask, algo.gamma, algo.lam)
    return batch.replace(advantages=gae_advantages, returns=returns, old_values=values)


@struct.dataclass
class Models:
    """What the optimiser steps work on (a pytree): the policy and its optimiser state, PPO's
    critic and its optimiser state (None without one), and the KL reference policy (None
    without a KL term; only read)."""

    policy: Any
    policy_opt: Any
    critic: Any = None
    critic_opt: Any = None
    reference: Any = None


def optimise(learner: Learner, filter_config: filtering.FilterConfig, models: Models, batch: Batch, kept_rows,
             loss_scale, lr_factor, dropout_key=None, rounding_key=None) -> tuple[Models, dict, jax.Array]:
    """The optimiser steps over the kept rows (first in `batch`): `filter.update` decides how
    many and which window of rows each trains on (a window of `mini_batch_size` rows whose rows
    past the window's end are masked). Returns the models after them, the statistics summed
    over the steps, and the steps run. `dropout_key` (with `learner.dropout`): step i's actor
    folds in (i, 0), its critic (i, 1); `rounding_key` (with stochastic weight rounding) the same."""
    algo, mb, total_rows = learner.algo, learner.algo.mini_batch_size, batch.loss_mask.shape[0]
    steps = filtering.update_steps(filter_config, kept_rows, total_rows, mb)
    zero_stats = {name: jnp.float32(0.0) for name in (*UPDATE_STATS, "update/micro_batches")}

    def one_step(i, carry):
        now, totals = carry
        start, end = filtering.step_rows(filter_config, i % steps, steps, kept_rows, mb)
        window = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, mb), batch)
        in_step = jnp.arange(mb) < end - start
        # A window picked by a traced index lives on a few devices (the batch is split in
        # contiguous blocks); pin its rows to the whole mesh again, or GSPMD replicates it
        # and every device computes the whole minibatch.
        mbatch = learner.rows(window.replace(loss_mask=window.loss_mask & in_step[:, None]))
        step_scale = filtering.step_loss_scale(filter_config, loss_scale, end - start, mb)
        key, round_key = fold(dropout_key, i), fold(rounding_key, i)
        policy, policy_opt, stats = actor_step(learner, now.policy, now.policy_opt, models.reference, mbatch,
                                               step_scale, lr_factor, fold(key, 0), fold(round_key, 0))
        now = now.replace(policy=policy, policy_opt=policy_opt)
        if algo.uses_critic:
            critic, critic_opt, critic_stats = critic_step(learner, now.critic, now.critic_opt, mbatch, lr_factor,
                                                           fold(key, 1), fold(round_key, 1))
            now = now.replace(critic=critic, critic_opt=critic_opt)
            stats.update(critic_stats)
        totals = {k: totals[k] + stats.get(k, 0.0) for k in totals}
        return now, totals

    iterations = steps * algo.epochs
    # the reference is only read: a constant of the loop, not carried (a carried copy costs memory)
    trained, totals = jax.lax.fori_loop(0, iterations, one_step, (models.replace(reference=None), zero_stats))
    return trained.replace(reference=models.reference), totals, iterations


def actor_step(learner: Learner, params, opt, reference, mbatch: Batch, scale, lr_factor, dropout_key=None,
               rounding_key=None):
    """One optimiser step of the policy on a minibatch: `losses.actor_loss` (the clipped policy
    loss times the filter's `scale`, minus the entropy bonus, plus the KL penalty to `reference`
    when set). `dropout_key`: the LoRA dropout's (`accumulate` folds in each micro-batch), or None;
    `rounding_key`: bfloat16 weights take the update rounded stochastically (`rounding`), or None."""
    algo, temperature = learner.algo, learner.temperature
    normaliser = losses.aggregation_normaliser(mbatch.loss_mask, algo.aggregation)
    token_count = jnp.maximum(mbatch.loss_mask.sum(), 1).astype(jnp.float32)

    train, whole = learner.trained(params)

    def loss_fn(t, b: Batch, key):
        p = whole(t)
        logp, entropy = policy_logprobs(nnx.merge(learner.policy_graph, p), b, temperature, key)
        ref_logp = None
        if algo.uses_reference:
            if learner.lora:  # the base model: the same weights, adapters off
                ref_model = lora_lib.adapters_off(nnx.merge(learner.policy_graph, jax.lax.stop_gradient(p)))
            else:
                ref_model = nnx.merge(learner.policy_graph, reference)
            ref_logp, _ = policy_logprobs(ref_model, b, temperature)
        total, terms = losses.actor_loss(algo, logp, entropy, ref_logp, b, normaliser, task_scale=scale)
        # token-weighted sums so the accumulated totals are minibatch means
        weight = b.loss_mask.sum() / token_count
        approx_kl = jnp.sum(jnp.where(b.loss_mask, b.old_logprobs - logp, 0.0)) / token_count
        return total, {**terms, "actor/clip_frac": terms["actor/clip_frac"] * weight, "actor/approx_kl": approx_kl}

    loss, aux, grads, micro_batches = accumulate(learner, loss_fn, train, mbatch, dropout_key)
    updates, opt = learner.actor_tx.update(grads, opt, train)
    params = whole(rounding.apply_updates(train, scaled(updates, lr_factor), rounding_key))
    return params, opt, {**aux, "actor/loss": loss, "actor/grad_norm": optax.global_norm(grads),
                         "update/micro_batches": micro_batches.astype(jnp.float32)}


def critic_step(learner: Learner, params, opt, mbatch: Batch, lr_factor, dropout_key=None, rounding_key=None):
    """One optimiser step of PPO's critic on a minibatch (clipped value loss, token mean);
    `dropout_key` and `rounding_key` as `actor_step`'s."""
    algo = learner.algo
    normaliser = losses.aggregation_normaliser(mbatch.loss_mask, "token-mean")

    train, whole = learner.trained(params)

    def loss_fn(t, b: Batch, key):
        values = critic_values(nnx.merge(learner.critic_graph, whole(t)), b, key)
        loss = losses.value_loss(values, b.old_values, b.returns, b.loss_mask, clip=algo.value_clip,
                                 normaliser=normaliser)
        return loss, {}

    loss, _, grads, _ = accumulate(learner, loss_fn, train, mbatch, dropout_key)
    updates, opt = learner.critic_tx.update(grads, opt, train)
    params = whole(rounding.apply_updates(train, scaled(updates, lr_factor), rounding_key))
    return params, opt, {"critic/vf_loss": loss, "critic/grad_norm": optax.global_norm(grads)}


def accumulate(learner: Learner, loss_fn, params, mbatch: Batch, dropout_key=None):
    """`accumulate_micro_batches` in the learner's micro-batches, each over the whole mesh."""
    return accumulate_micro_batches(loss_fn, params, mbatch, learner.algo.micro_batch, learner.rows, dropout_key)


def accumulate_micro_batches(loss_fn, params, mbatch: Batch, size: int, rows=lambda b: b, dropout_key=None):
    """Sum of (loss, aux, grads) of `loss_fn(params, micro-batch, key)` over micro-batches of
    `size` rows (`rows` pins each one's rows across a mesh), and how many ran; micro-batch i's
    key is fold_in(dropout_key, i) (None without one). The losses use the whole minibatch's
    normaliser, so the sum is the minibatch loss whatever the micro-batch size. Kept rows come
    first, so the micro-batches after the last one with a loss token hold only padding (the
    filter's dropped groups): their terms are exactly zero, and they are not run — with ~30 rows
    kept of a 64-row minibatch, half the work."""
    micro = jax.tree.map(lambda a: a.reshape((a.shape[0] // size, size) + a.shape[1:]), mbatch)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    count = micro.loss_mask.shape[0]
    has_tokens = micro.loss_mask.reshape(count, -1).any(axis=1)
    needed = jnp.max(jnp.where(has_tokens, jnp.arange(1, count + 1), 0))

    def body(i, acc):
        one = jax.tree.map(lambda a: a[i], micro)
        (loss, aux), grads = grad_fn(params, rows(one), fold(dropout_key, i))
        return jax.tree.map(jnp.add, acc, (loss, aux, grads))

    (loss, aux), grads = jax.eval_shape(grad_fn, params, jax.tree.map(lambda a: a[0], micro), dropout_key)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss, aux, grads))
    loss, aux, grads = jax.lax.fori_loop(0, needed, body, zeros)
    return loss, aux, grads, needed


def fold(key, data):
    """jax.random.fold_in(key, data), or None without a key (no dropout, no stochastic rounding)."""
    return None if key is None else jax.random.fold_in(key, data)


def scaled(updates, factor):
    """An optimiser's updates times the learning-rate factor (AdamW's update, weight decay
    included, is proportional to its rate)."""
    return jax.tree.map(lambda u: (u * factor).astype(u.dtype), updates)


def split(a: jax.Array, size: int) -> jax.Array:
    """[B, ...] -> [B / size, size, ...]: minibatches along the leading axis."""
    return a.reshape((a.shape[0] // size, size) + a.shape[1:])
