"""Gradient analysis by reward-variance bucket: the evidence for the SNR mechanism
(docs/method.md#template-collapse, docs/method.md#the-gradient-analysis).

Why. Template collapse is explained by a signal-to-noise argument: the policy-gradient
(task) term of one prompt is bounded, by Cauchy-Schwarz, by the square root of that prompt's
reward variance, while the KL and entropy regularisers do not look at the reward at all and
pull every prompt the same way with a roughly constant strength. On prompts whose rollouts all
earn about the same reward, regularisation therefore dominates the update and drives every
input towards the same template; SNR-aware filtering drops those prompts.

What is measured. Prompt groups are bucketed by the quantile
of their in-group reward std (`reward_std_buckets`). For every bucket, `gradient_norms` gives
the global L2 norm of

- the gradient of the task loss: the clipped policy-gradient surrogate of the update's actor
  loss, `rl.losses.actor_loss` (without the filter's loss scale), restricted to the bucket's
  rows, and
- the gradient of the regularisation loss: the rest of that loss, −entropy_coef·entropy +
  kl_coef·KL, on the same rows (the KL term only when kl_coef > 0 and reference parameters
  are given),

each aggregated with the bucket's own normaliser (`rl.losses.aggregation_normaliser` of the
bucket's loss mask), so masking the other rows out is exactly the same as slicing the
bucket's rows into a batch of their own.

Expected picture: the task-gradient norm grows with the bucket's reward std (it is exactly
zero for a zero-variance bucket under group-baseline advantages, whose advantages are all
zero) while the regularisation-gradient norm stays roughly flat across buckets. Their ratio
is the per-bucket SNR; the low-variance buckets are the ones where regularisation wins.
Note that GRPO's division by the group std removes most of the growth between non-zero
buckets (every varying group gets unit-std advantages); the growth shows under GAE or
Dr.GRPO advantages, which keep the reward's scale.

Cost: per bucket, one forward over the bucket's rows (plus one of the reference, for KL)
and two backward passes reusing its residuals (`jax.vjp`), one bucket at a time (`lax.map`),
so only one bucket's activations and one gradient pytree are alive at once. With
`rows_per_bucket = bucket_capacity(...)` only the bucket's rows are computed, and the whole
analysis costs about one forward and two backward passes over the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.rl import losses
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.batch import Batch, policy_logprobs


def reward_std_buckets(group_rewards: jax.Array, num_buckets: int = 6) -> jax.Array:
    """int32[G]: the reward-std quantile bucket of each group, from rewards [G, N].

    Rule: std = the unbiased (ddof 1) std of each group's N rewards, in float32. The groups
    are sorted by std ascending with a *stable* sort (equal stds keep their group-index
    order; a NaN std sorts last), the rank r ∈ [0, G) of each group is its position in that
    order, and its bucket is floor(r · num_buckets / G). So bucket b holds the contiguous
    ranks [ceil(b·G/nb), ceil((b+1)·G/nb)): sizes differ by at most one when G is not
    divisible by num_buckets (e.g. G=7, nb=3: 3, 2, 2), and with num_buckets > G some
    buckets are empty.
    Groups with equal std may straddle a bucket boundary: the lower group index goes to the
    lower bucket. Jittable (num_buckets static).
    """
    group_rewards = jnp.asarray(group_rewards, jnp.float32)
    if group_rewards.ndim != 2 or group_rewards.shape[1] < 2:
        raise ValueError(f"group_rewards must be [G, N] with N >= 2 (got shape {group_rewards.shape}): "
                         "the unbiased std of fewer than two rewards is undefined")
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets} must be >= 1")
    groups = group_rewards.shape[0]
    std = jnp.std(group_rewards, axis=1, ddof=1)
    order = jnp.argsort(std, stable=True)
    rank = jnp.zeros(groups, jnp.int32).at[order].set(jnp.arange(groups, dtype=jnp.int32))
    return (rank * num_buckets) // groups


def _group_reward_std(row_rewards: jax.Array, group_of_row: jax.Array, num_groups: int) -> jax.Array:
    """f32[G]: unbiased std of the row rewards of each group (NaN for a group of < 2 rows)."""
    count = jax.ops.segment_sum(jnp.ones_like(row_rewards), group_of_row, num_groups)
    mean = jax.ops.segment_sum(row_rewards, group_of_row, num_groups) / count
    squares = jax.ops.segment_sum(jnp.square(row_rewards - mean[group_of_row]), group_of_row, num_groups)
    return jnp.sqrt(squares / (count - 1.0))


def _norm(tree) -> jax.Array:
    """Global L2 norm of a pytree, accumulated in float32."""
    leaves = jax.tree.leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def bucket_capacity(num_groups: int, group_size: int, num_buckets: int) -> int:
    """Rows a `reward_std_buckets` bucket can hold: ceil(G / num_buckets) groups of N rows.
    The value to pass as `gradient_norms(rows_per_bucket=...)` for such buckets."""
    return -(-num_groups // num_buckets) * group_size


def gradient_norms(
    policy_graph: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    group_of_row: jax.Array,
    buckets: jax.Array,
    num_buckets: int,
    algo: AlgoConfig,
    *,
    temperature: float,
    reference_params: nnx.State | None = None,
    rows_per_bucket: int | None = None,
    lora: bool = False,
) -> dict[str, jax.Array]:
    """Per reward-std bucket, the norms of the task- and regularisation-loss gradients.

    policy_graph, params: the policy (`nnx.graphdef` / `nnx.state` of a `Decoder`); batch: the
    update's view of the rollout with advantages filled in (`ragen_jax.rl.batch.Batch`);
    group_of_row: int[B] group index of every row; buckets: int32[G] bucket of every group
    (`reward_std_buckets`); num_buckets: static bucket count. The loss is the update's,
    `rl.losses.actor_loss` with `algo`, on log-probs at the sampling `temperature`; its KL term
    counts when `algo.uses_reference` and `reference_params` are given. `lora`: the policy has
    LoRA adapters (models/lora.py): the gradients are over the adapters (what trains), and the
    KL reference is the policy with its adapters off (`reference_params` unused).

    Returns, for b in [0, num_buckets):
      grad/bucket{b}/task_norm   ‖∇θ clipped surrogate(rows of bucket b)‖₂
      grad/bucket{b}/reg_norm    ‖∇θ (−entropy_coef·entropy + kl_coef·KL)(rows of bucket b)‖₂
      grad/bucket{b}/reward_std  mean over the bucket's groups of their unbiased reward std
                                 (each row's summed `batch.rewards`: its episode reward)
      grad/bucket{b}/groups      how many groups the bucket holds
    Each loss uses the bucket's own aggregation normaliser, so it equals the loss of a batch
    made of the bucket's rows alone.

    Static shapes: per bucket (one at a time, `lax.map`) `rows_per_bucket` rows (default: all
    B) are gathered, the bucket's first, the rest masked out; with `bucket_capacity(G, N,
    num_buckets)` the analysis costs about one forward and two backward passes over the batch.
    Rows are independent in the model, so the capacity changes the cost, not the result.

    NaN, never a crash: a bucket without a loss token (or without groups) has NaN norms and a
    NaN reward std (with 0 groups); a bucket with more rows than `rows_per_bucket` has NaN
    norms. Jittable, with policy_graph, num_buckets, algo and the keyword arguments static.
    """
    num_rows = batch.loss_mask.shape[0]
    capacity = num_rows if rows_per_bucket is None else min(int(rows_per_bucket), num_rows)
    if capacity < 1:
        raise ValueError(f"rows_per_bucket={rows_per_bucket} must be >= 1")
    reference = reference_params if algo.uses_reference else None
    logprobs = lambda p, rows: policy_logprobs(nnx.merge(policy_graph, p), rows, temperature)
    if lora:
        from ragen_jax.models import lora as lora_lib

        params, frozen = lora_lib.split_trainable(params)
        whole = lambda t: lora_lib.join(t, frozen)
        logprobs = lambda t, rows: policy_logprobs(nnx.merge(policy_graph, whole(t)), rows, temperature)
        if algo.uses_reference:
            base = lambda rows: policy_logprobs(
                lora_lib.adapters_off(nnx.merge(policy_graph, jax.lax.stop_gradient(whole(params)))), rows,
                temperature)
            reference = _Reference(base)
    row_bucket = buckets[group_of_row]

    def one_bucket(b):
        member = row_bucket == b
        picked = jnp.argsort(~member, stable=True)[:capacity]  # the bucket's rows first
        rows = jax.tree.map(lambda a: a[picked], batch)
        rows = rows.replace(loss_mask=rows.loss_mask & member[picked][:, None])
        task, reg = _task_and_reg_norms(algo, logprobs, params, reference, rows)
        undefined = ~jnp.any(rows.loss_mask) | (jnp.sum(member) > capacity)
        return jnp.where(undefined, jnp.nan, task), jnp.where(undefined, jnp.nan, reg)

    task_norms, reg_norms = jax.lax.map(one_bucket, jnp.arange(num_buckets, dtype=buckets.dtype))
    return _bucket_metrics(task_norms, reg_norms, batch, group_of_row, buckets)


class _Reference:
    """A KL reference given by its log-prob function (a LoRA policy's base)."""

    def __init__(self, logprobs):
        self.logprobs = logprobs


def _task_and_reg_norms(algo: AlgoConfig, logprobs, params, reference, rows: Batch):
    """‖∇θ task‖₂ and ‖∇θ regularisation‖₂ of `rl.losses.actor_loss` on `rows`, with their own
    normaliser: the task term is its clipped surrogate, the regularisation the loss with the
    task term weighted 0. One forward (plus one of the reference for KL); each term's
    cotangent is pulled back to the parameters through the same residuals (`jax.vjp`)."""
    normaliser = losses.aggregation_normaliser(rows.loss_mask, algo.aggregation)
    (logp, entropy), pullback = jax.vjp(lambda p: logprobs(p, rows), params)
    if reference is None:
        ref_logp = None
    elif isinstance(reference, _Reference):  # LoRA: the policy with its adapters off
        ref_logp = reference.logprobs(rows)[0]
    else:
        ref_logp = logprobs(reference, rows)[0]
    loss = lambda lp, ent, task_scale: losses.actor_loss(algo, lp, ent, ref_logp, rows, normaliser, task_scale)
    d_task = jax.grad(lambda lp, ent: loss(lp, ent, 1.0)[1]["actor/pg_loss"], argnums=(0, 1))(logp, entropy)
    d_reg = jax.grad(lambda lp, ent: loss(lp, ent, 0.0)[0], argnums=(0, 1))(logp, entropy)
    return _norm(pullback(d_task)), _norm(pullback(d_reg))


def _bucket_metrics(task_norms, reg_norms, batch: Batch, group_of_row, buckets) -> dict[str, jax.Array]:
    """The per-bucket metrics of `gradient_norms`: the norms, the mean reward std of the
    bucket's groups (NaN when it has none) and its group count."""
    row_rewards = jnp.sum(batch.rewards.astype(jnp.float32), axis=-1)
    group_std = _group_reward_std(row_rewards, group_of_row, buckets.shape[0])
    metrics = {}
    for b in range(task_norms.shape[0]):
        members = buckets == b
        count = jnp.sum(members)
        mean_std = jnp.sum(jnp.where(members, group_std, 0.0)) / count  # 0/0 = NaN when empty
        metrics[f"grad/bucket{b}/task_norm"] = task_norms[b]
        metrics[f"grad/bucket{b}/reg_norm"] = reg_norms[b]
        metrics[f"grad/bucket{b}/reward_std"] = mean_std
        metrics[f"grad/bucket{b}/groups"] = count.astype(jnp.float32)
    return metrics
