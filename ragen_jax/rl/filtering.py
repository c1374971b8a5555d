"""SNR-aware filtering: keep the rollout groups whose rewards vary, drop the rest (SPEC §4).

A group whose trajectories all earn the same reward carries no policy-gradient signal (its
group-relative advantages are zero) but still costs a full update; its in-group reward
variance is the signal-to-noise proxy. After the rollout every group gets a score
(by default the unbiased std of its trajectories' total rewards), a strategy keeps a subset
of whole groups, and the update then runs over the kept groups only.

Strategies, over the groups left after the optional zero-score removal:
- `top_p` (linear): sort by score, descending (ties: lower index first); keep the shortest
  prefix whose cumulative score reaches ρ·Σscore − ε, never a group with score ≤ 0; a
  threshold ≤ 0 keeps nothing. `prob_mode="softmax"`: p = softmax(scores), keep
  searchsorted(cumsum(p), ρ) + 1 groups. ρ ≥ 1 keeps every group in both modes.
- `top_k`: k = max(1, int(ρ · num_groups)) best groups; `top_k_abs`: k = max(1, int(ρ)).
- `min_p`: keep score ≥ ρ · max score.
- `none`: keep every group.
`include_zero=False` first removes groups with |score| ≤ 1e-10, before every strategy.

Everything is a pure function of static-shaped arrays, so it runs inside the jitted step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

METRICS = ("reward_variance", "reward_mean", "entropy")
STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p", "none")
PROB_MODES = ("linear", "softmax")
LOSS_SCALINGS = ("none", "linear", "sqrt")
ZERO = 1e-10  # |score| at or below this counts as zero
# The same test on float32 scores: float32(1e-10) is slightly above 1e-10, so "> 1e-10" in
# exact arithmetic is ">" the largest float32 not above it.
_ZERO_F32 = float(np.nextafter(np.float32(ZERO), np.float32(0)))
EPSILON = 0.01  # top_p (linear) stops this far short of ρ·Σscore


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """Static filter settings (the defaults are the paper's: top-p 0.9 on reward std)."""

    metric: str = "reward_variance"
    strategy: str = "top_p"
    rho: float = 0.9
    prob_mode: str = "linear"
    include_zero: bool = True
    loss_scaling: str = "none"
    # Beyond the paper (SPEC §6): keep each dropped group with this probability anyway, so a
    # collapsed prompt set still gets some gradient and can recover.
    bootstrap_fraction: float = 0.0

    def __post_init__(self):
        for name, allowed in (
            ("metric", METRICS),
            ("strategy", STRATEGIES),
            ("prob_mode", PROB_MODES),
            ("loss_scaling", LOSS_SCALINGS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"filter.{name}={value!r} is not supported; allowed: {', '.join(allowed)}")
        if self.rho < 0:
            raise ValueError(f"filter.rho={self.rho} must be >= 0")
        if not 0.0 <= self.bootstrap_fraction <= 1.0:
            raise ValueError(f"filter.bootstrap_fraction={self.bootstrap_fraction} must be in [0, 1]")

    def check_group_size(self, group_size: int) -> None:
        if self.metric == "reward_variance" and group_size < 2:
            raise ValueError(
                f"filter.metric='reward_variance' needs group_size >= 2 (got {group_size}): "
                "the std of a single trajectory is undefined"
            )


# ---------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------


def group_scores(
    config: FilterConfig,
    rewards: jax.Array,
    token_entropy: jax.Array | None = None,
    token_mask: jax.Array | None = None,
) -> jax.Array:
    """f32[G] score per group from total rewards [G, N] (and, for `entropy`, the per-token
    entropies [G, N, T] of the generated tokens with their mask)."""
    rewards = rewards.astype(jnp.float32)
    if config.metric == "reward_variance":
        return jnp.std(rewards, axis=1, ddof=1)
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
    """Also keep each dropped group with probability `bootstrap_fraction` (SPEC §6)."""
    if config.bootstrap_fraction == 0.0:
        return keep
    return keep | jax.random.bernoulli(key, config.bootstrap_fraction, keep.shape)


def loss_scale(config: FilterConfig, keep: jax.Array) -> jax.Array:
    """Multiplier of the policy loss after filtering: 1, the keep ratio, or its square root."""
    ratio = keep.mean(dtype=jnp.float32)
    if config.loss_scaling == "linear":
        return ratio
    if config.loss_scaling == "sqrt":
        return jnp.sqrt(ratio)
    return jnp.float32(1.0)


def kept_first(keep: jax.Array) -> jax.Array:
    """A permutation of the groups with the kept ones first (in index order): the update
    then loops over just the first ceil(kept / minibatch) minibatches."""
    return jnp.argsort(~keep, stable=True)


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
    reward_std = jnp.std(rewards.astype(jnp.float32), axis=1, ddof=1) if rewards.shape[1] > 1 else jnp.zeros(
        rewards.shape[0]
    )
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
