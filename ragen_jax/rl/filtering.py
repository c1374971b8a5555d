"""SNR-aware filtering: keep the rollout groups whose rewards vary, drop the rest
(docs/method.md#the-reward-variance-filter).

A group whose trajectories all earn the same reward carries no policy-gradient signal (its
group-relative advantages are zero) but still costs a full update; its in-group reward
variance is the signal-to-noise proxy. After the rollout every group gets a score, a strategy
keeps a subset of whole groups, and the update then runs over the kept groups only.

Scores (`metric`): `reward_var` (the paper's: the sample variance of the group's total rewards,
`ddof` 1 by default, so Top-p accumulates variance mass), `reward_std` (its square root, as
RAGEN's released code ranks), `reward_mean`, `entropy` (mean token entropy of the generated
tokens). `reward_variance`, the name `reward_std` had before, is still accepted and read as
`reward_std`, so saved run configs keep their meaning. A group whose rewards are all equal
scores exactly 0 (deviations are taken from the group's first reward, which are exact zeros
then), so `include_zero=False` drops it whatever its reward.

Strategies, over the groups left after the optional zero-score removal:
- `top_p` (linear): sort by score, descending (ties: lower index first); keep the shortest
  prefix whose cumulative score reaches ρ·Σscore − ε, never a group with score ≤ 0; a
  threshold ≤ 0 keeps nothing. `prob_mode="softmax"`: p = softmax(scores), keep
  searchsorted(cumsum(p), ρ) + 1 groups. ρ ≥ 1 keeps every group in both modes.
- `top_k`: k = max(1, int(ρ · num_groups)) best groups; `top_k_abs`: k = max(1, int(ρ)).
- `min_p`: keep score ≥ ρ · max score.
- `none`: keep every group.
`include_zero=False` first removes groups with |score| ≤ 1e-10, before every strategy.

The update over the kept rows (`update`, `update_plan`):
- `paper`: as many optimiser steps per epoch as an unfiltered batch takes (batch / minibatch),
  the kept rows split evenly over them, so each step's minibatch shrinks by the keep rate;
  filters that keep different amounts still take the same number of optimiser steps.
- `fewer_steps`: minibatches of the configured size, ceil(kept rows / minibatch) of them.
Either way the update's compute falls with the kept rows. `loss_scaling` (none | linear | sqrt)
multiplies the policy loss by the keep ratio (or its square root), as RAGEN scales the
advantages; in `paper` mode by each step's own ratio, rows / minibatch size.

Everything is a pure function of static-shaped arrays, so it runs inside the jitted step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

METRICS = ("reward_var", "reward_std", "reward_mean", "entropy")
METRIC_ALIASES = {"reward_variance": "reward_std"}  # an accepted alias, read in saved run configs
STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p", "none")
PROB_MODES = ("linear", "softmax")
LOSS_SCALINGS = ("none", "linear", "sqrt")
UPDATES = ("paper", "fewer_steps")
ZERO = 1e-10  # |score| at or below this counts as zero
# The same test on float32 scores: float32(1e-10) is slightly above 1e-10, so "> 1e-10" in
# exact arithmetic is ">" the largest float32 not above it.
_ZERO_F32 = float(np.nextafter(np.float32(ZERO), np.float32(0)))
EPSILON = 0.01  # top_p (linear) stops this far short of ρ·Σscore


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """Static filter settings; the defaults are the paper's: Top-p 0.9 on the reward variance,
    the same number of optimiser steps whatever is kept."""

    metric: str = "reward_var"
    strategy: str = "top_p"
    rho: float = 0.9
    prob_mode: str = "linear"
    include_zero: bool = True
    loss_scaling: str = "none"
    # Beyond the paper (docs/method.md#bootstrapping): keep each dropped group with this
    # probability anyway, so a collapsed prompt set still gets some gradient and can recover.
    bootstrap_fraction: float = 0.0
    ddof: int = 1  # reward_var / reward_std: divide the squared deviations by group_size - ddof
    update: str = "paper"

    def __post_init__(self):
        object.__setattr__(self, "metric", METRIC_ALIASES.get(self.metric, self.metric))
        for name, allowed in (
            ("metric", METRICS),
            ("strategy", STRATEGIES),
            ("prob_mode", PROB_MODES),
            ("loss_scaling", LOSS_SCALINGS),
            ("update", UPDATES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"filter.{name}={value!r} is not supported; allowed: {', '.join(allowed)}")
        if self.rho < 0:
            raise ValueError(f"filter.rho={self.rho} must be >= 0")
        if not 0.0 <= self.bootstrap_fraction <= 1.0:
            raise ValueError(f"filter.bootstrap_fraction={self.bootstrap_fraction} must be in [0, 1]")
        if isinstance(self.ddof, bool) or not isinstance(self.ddof, (int, np.integer)) or self.ddof < 0:
            raise ValueError(f"filter.ddof={self.ddof!r} must be an integer >= 0 (1: the unbiased sample variance)")

    def check_group_size(self, group_size: int) -> None:
        if self.metric in ("reward_var", "reward_std") and group_size <= self.ddof:
            raise ValueError(
                f"filter.metric={self.metric!r} with filter.ddof={self.ddof} needs group_size > {self.ddof} "
                f"(got {group_size}): the spread of a group that small is undefined"
            )


# ---------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------


def reward_variance(rewards: jax.Array, ddof: int = 1) -> jax.Array:
    """Sample variance of each row of [G, N], Σ(r − mean)² / (N − ddof), computed on the
    deviations from the row's first value. A row of equal values then gives exactly 0 in any
    dtype: its deviations are exact zeros, where the mean of values like 10.9 or 0.3 rounds
    and leaves a variance of ~1e-14 (a std of ~1e-7, far above the zero test)."""
    shifted = rewards - rewards[:, :1]
    centred = shifted - jnp.mean(shifted, axis=1, keepdims=True)
    return jnp.sum(centred * centred, axis=1) / (rewards.shape[1] - ddof)


def group_scores(
    config: FilterConfig,
    rewards: jax.Array,
    token_entropy: jax.Array | None = None,
    token_mask: jax.Array | None = None,
) -> jax.Array:
    """f32[G] score per group from total rewards [G, N] (and, for `entropy`, the per-token
    entropies [G, N, T] of the generated tokens with their mask)."""
    rewards = rewards.astype(jnp.float32)
    if config.metric == "reward_var":
        return reward_variance(rewards, config.ddof)
    if config.metric == "reward_std":
        return jnp.sqrt(reward_variance(rewards, config.ddof))
    if config.metric == "reward_mean":
        return jnp.mean(rewards, axis=1)
    if token_entropy is None or token_mask is None:
        raise ValueError("filter.metric='entropy' needs the generated tokens' entropies and mask")
    mask = token_mask.astype(jnp.float32)
    total = jnp.sum(token_entropy * mask, axis=(1, 2))
    return total / jnp.maximum(jnp.sum(mask, axis=(1, 2)), 1.0)


# ---------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------


def _ranking(scores: jax.Array, candidate: jax.Array) -> jax.Array:
    """Group indices, candidates first by descending score (stable), the others last."""
    return jnp.lexsort((-scores, ~candidate))


def _keep_first(order: jax.Array, count: jax.Array) -> jax.Array:
    """bool[G]: the first `count` groups of `order`."""
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
    return rank < count


def select_groups(config: FilterConfig, scores: jax.Array) -> jax.Array:
    """bool[G]: which groups the update keeps."""
    num_groups = scores.shape[0]
    scores = scores.astype(jnp.float32)
    candidate = jnp.ones(num_groups, bool)
    if not config.include_zero:
        candidate = jnp.abs(scores) > _ZERO_F32
    available = candidate.sum()
    strategy, rho = config.strategy, config.rho

    if strategy == "none" or (strategy == "top_p" and rho >= 1.0):
        return candidate
    order = _ranking(scores, candidate)
    sorted_scores = scores[order]
    sorted_candidate = candidate[order]

    if strategy == "top_p" and config.prob_mode == "linear":
        threshold = rho * jnp.sum(jnp.where(candidate, scores, 0.0)) - EPSILON
        before = jnp.cumsum(jnp.where(sorted_candidate, sorted_scores, 0.0)) - jnp.where(
            sorted_candidate, sorted_scores, 0.0
        )
        # Sorted descending, so "stop at a score <= 0" is "never take a score <= 0".
        take = sorted_candidate & (sorted_scores > 0) & (before < threshold)
        return jnp.zeros(num_groups, bool).at[order].set(take)
    if strategy == "top_p":  # softmax
        probs = jax.nn.softmax(jnp.where(sorted_candidate, sorted_scores, -jnp.inf))
        count = jnp.searchsorted(jnp.cumsum(probs), rho, side="left") + 1
        return _keep_first(order, jnp.minimum(count, available)) & candidate
    if strategy == "top_k":
        count = max(1, int(rho * num_groups))
        return _keep_first(order, jnp.minimum(count, available)) & candidate
    if strategy == "top_k_abs":
        count = max(1, int(rho))
        return _keep_first(order, jnp.minimum(count, available)) & candidate
    # min_p
    best = jnp.max(jnp.where(candidate, scores, -jnp.inf))
    return candidate & (scores >= rho * best - ZERO)


def bootstrap(config: FilterConfig, key: jax.Array, keep: jax.Array) -> jax.Array:
    """Also keep each dropped group with probability `bootstrap_fraction`
    (docs/method.md#bootstrapping)."""
    if config.bootstrap_fraction == 0.0:
        return keep
    return keep | jax.random.bernoulli(key, config.bootstrap_fraction, keep.shape)


def loss_scale(config: FilterConfig, keep: jax.Array) -> jax.Array:
    """Multiplier of the policy loss after filtering: 1, the keep ratio, or its square root."""
    return _scaling(config, keep.mean(dtype=jnp.float32))


def _scaling(config: FilterConfig, ratio: jax.Array) -> jax.Array:
    if config.loss_scaling == "linear":
        return ratio
    if config.loss_scaling == "sqrt":
        return jnp.sqrt(ratio)
    return jnp.float32(1.0)


def kept_first(keep: jax.Array) -> jax.Array:
    """A permutation of the groups with the kept ones first (in index order): the update
    then reads only the rows at the front."""
    return jnp.argsort(~keep, stable=True)


# ---------------------------------------------------------------------------------------
# The update's plan over the kept rows
# ---------------------------------------------------------------------------------------


def update_steps(config: FilterConfig, kept_rows: jax.Array, batch: int, mini_batch: int) -> jax.Array:
    """Optimiser steps per epoch over the `kept_rows` rows at the front of the kept-first order:
    `fewer_steps`: ceil(kept / mini_batch); `paper`: batch / mini_batch, what an unfiltered batch
    takes, or `kept_rows` when fewer rows are kept (a step needs a row); 0 when nothing is."""
    if config.update == "fewer_steps":
        return (kept_rows + mini_batch - 1) // mini_batch
    return jnp.minimum(batch // mini_batch, kept_rows)


def step_rows(config: FilterConfig, i: jax.Array, steps: jax.Array, kept_rows: jax.Array,
              mini_batch: int) -> tuple[jax.Array, jax.Array]:
    """Rows [start, end) of the kept-first order that optimiser step i (0 <= i < steps) trains
    on: `fewer_steps`: consecutive minibatches of `mini_batch` rows, the last one partial;
    `paper`: the kept rows split evenly, floor(i·kept/steps) to floor((i+1)·kept/steps), so the
    steps' sizes differ by at most one row. Never more than `mini_batch` rows."""
    if config.update == "fewer_steps":
        return i * mini_batch, jnp.minimum((i + 1) * mini_batch, kept_rows)
    steps = jnp.maximum(steps, 1)
    return i * kept_rows // steps, (i + 1) * kept_rows // steps


def step_loss_scale(config: FilterConfig, batch_scale: jax.Array, rows: jax.Array, mini_batch: int) -> jax.Array:
    """The policy-loss multiplier of an optimiser step over `rows` rows: `fewer_steps`: the
    batch's (`loss_scale`); `paper`: that of the step's own keep ratio, rows / mini_batch, whose
    mean over the steps is the batch's keep ratio. With `linear` in `paper` mode a kept row then
    weighs in its step's loss what it weighs in an unfiltered minibatch (exactly so for the
    sequence-mean aggregations, whose normaliser is the number of rows)."""
    if config.update == "fewer_steps":
        return batch_scale
    return _scaling(config, rows.astype(jnp.float32) / mini_batch)


# ---------------------------------------------------------------------------------------
# The whole filter step and its metrics
# ---------------------------------------------------------------------------------------


def filter_groups(
    config: FilterConfig,
    key: jax.Array,
    rewards: jax.Array,
    success: jax.Array,
    token_entropy: jax.Array | None = None,
    token_mask: jax.Array | None = None,
):
    """Scores, selection and the logged metrics for rewards/success [G, N].

    Returns (keep bool[G], scale f32 scalar, metrics dict of f32 scalars).
    """
    config.check_group_size(rewards.shape[1])
    scores = group_scores(config, rewards, token_entropy, token_mask)
    keep = bootstrap(config, key, select_groups(config, scores))
    rewards = rewards.astype(jnp.float32)
    # exactly 0 for a group of equal rewards, so the zero-variance counts catch every such group
    reward_std = jnp.sqrt(reward_variance(rewards)) if rewards.shape[1] > 1 else jnp.zeros(rewards.shape[0])
    zero_variance = reward_std <= ZERO
    kept = keep.sum()
    metrics = {
        "filter/kept_ratio": keep.mean(dtype=jnp.float32),
        "filter/kept_count": kept.astype(jnp.float32),
        "filter/empty": (kept == 0).astype(jnp.float32),
        "filter/zero_variance_all_success": (zero_variance & success.all(axis=1)).sum().astype(jnp.float32),
        "filter/zero_variance_all_fail": (zero_variance & ~success.any(axis=1)).sum().astype(jnp.float32),
        "filter/in_group_reward_std_mean": reward_std.mean(),
        "filter/in_group_reward_std_max": reward_std.max(),
        "filter/chosen_group_std": jnp.sum(jnp.where(keep, reward_std, 0.0)) / jnp.maximum(kept, 1),
    }
    return keep, loss_scale(config, keep), metrics
