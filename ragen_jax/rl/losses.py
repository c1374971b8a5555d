"""Policy, value, KL and entropy losses with the aggregation modes of
docs/method.md#policy-loss-clipping-and-aggregation.

All inputs are token-level [B, T] arrays with `mask` marking the generated tokens that get
loss; every function returns a scalar (and the clip fraction where it is logged). `actor_loss`
puts them together into the policy's loss, for the update and the gradient analysis alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from ragen_jax.rl.algorithms import AlgoConfig
    from ragen_jax.rl.batch import Batch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k3")


def aggregate(loss: jax.Array, mask: jax.Array, mode: str, normaliser: jax.Array | None = None) -> jax.Array:
    """token-mean: over all loss tokens; seq-mean-token-mean: per-sequence token mean, then the
    mean over sequences; seq-mean-token-sum: per-sequence token sum, then the mean over
    sequences. Sequences without a loss token are left out of the sequence means.

    `normaliser` replaces the denominator (the loss-token or sequence count): pass
    `aggregation_normaliser` of a whole minibatch to sum micro-batch losses into exactly the
    minibatch's loss (gradient accumulation without changing the objective)."""
    mask = mask.astype(jnp.float32)
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r} is not supported; allowed: {', '.join(AGGREGATIONS)}")
    if normaliser is None:
        normaliser = aggregation_normaliser(mask, mode)
    if mode == "token-mean":
        return jnp.sum(loss * mask) / normaliser
    tokens = jnp.sum(mask, axis=-1)
    per_sequence = jnp.sum(loss * mask, axis=-1)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / jnp.maximum(tokens, 1.0)
    return jnp.sum(per_sequence) / normaliser  # sequences without tokens contribute 0


def aggregation_normaliser(mask: jax.Array, mode: str) -> jax.Array:
    """The denominator of `aggregate`: loss tokens (token-mean) or sequences with at least
    one loss token (the sequence means), at least 1."""
    mask = mask.astype(jnp.float32)
    if mode == "token-mean":
        return jnp.maximum(jnp.sum(mask), 1.0)
    return jnp.maximum(jnp.sum(jnp.sum(mask, axis=-1) > 0), 1.0)


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    normaliser: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate with separate ε_low/ε_high (clip-higher); with `dual_clip` = c,
    the loss of a negative-advantage token is also capped at −A·c. Returns (loss, clip fraction)."""
    ratio = jnp.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = jnp.where(advantages < 0, jnp.minimum(loss, -advantages * dual_clip), loss)
    clip_fraction = aggregate((clipped > unclipped).astype(jnp.float32), mask, "token-mean")
    return aggregate(loss, mask, aggregation, normaliser), clip_fraction


def actor_loss(algo: AlgoConfig, logprobs: jax.Array, entropy: jax.Array, ref_logprobs: jax.Array | None,
               rows: Batch, normaliser: jax.Array, task_scale=1.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The policy's loss on `rows` (their old log-probs, advantages and loss mask), as the update
    trains it: task_scale · clipped surrogate − entropy_coef · entropy, plus kl_coef · KL to the
    reference when `ref_logprobs` is given (constants: no gradient), every term aggregated with
    `algo.aggregation` and `normaliser`. `task_scale` is the filter's loss scale; 0 leaves the
    regularisation alone. One function, so the gradient analysis measures the loss the update
    trains. Returns (loss, its terms: actor/pg_loss, actor/entropy, actor/kl, actor/clip_frac)."""
    mask, aggregation = rows.loss_mask, algo.aggregation
    pg, clip_fraction = policy_loss(logprobs, rows.old_logprobs, rows.advantages, mask, clip_low=algo.clip_low,
                                    clip_high=algo.clip_high, dual_clip=algo.dual_clip, aggregation=aggregation,
                                    normaliser=normaliser)
    ent = aggregate(entropy, mask, aggregation, normaliser)
    loss = task_scale * pg - algo.entropy_coef * ent
    kl = jnp.float32(0.0)
    if ref_logprobs is not None:
        kl = aggregate(kl_penalty(logprobs, jax.lax.stop_gradient(ref_logprobs), algo.kl_estimator), mask,
                       aggregation, normaliser)
        loss = loss + algo.kl_coef * kl
    return loss, {"actor/pg_loss": pg, "actor/entropy": ent, "actor/kl": kl, "actor/clip_frac": clip_fraction}


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL(π‖π_ref) estimate from sampled tokens: k1 = log π − log π_ref; k3 (low
    variance, always ≥ 0) = r − log r − 1 with r = π_ref/π, clamped to [−10, 10] as verl."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator != "k3":
        raise ValueError(f"kl estimator {estimator!r} is not supported; allowed: {', '.join(KL_ESTIMATORS)}")
    log_ratio = ref_logprobs - logprobs
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)


def value_loss(
    values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *, clip: float = 0.5,
    aggregation: str = "token-mean", normaliser: jax.Array | None = None,
) -> jax.Array:
    """½·max((v − R)², (clip(v, v_old ± clip) − R)²), aggregated over the masked tokens."""
    clipped = jnp.clip(values, old_values - clip, old_values + clip)
    loss = 0.5 * jnp.maximum(jnp.square(values - returns), jnp.square(clipped - returns))
    return aggregate(loss, mask, aggregation, normaliser)
