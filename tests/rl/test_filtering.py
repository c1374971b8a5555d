"""SNR-aware filtering against a plain NumPy/Python reading of SPEC §4, on random scores."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ragen_jax.rl.filtering import FilterConfig, filter_groups, group_scores, kept_first, loss_scale, select_groups

NUM_GROUPS = 8


def reference_select(scores, strategy, rho, prob_mode="linear", include_zero=True):
    """SPEC §4 as a loop over Python floats: the list of kept group indices."""
    groups = [g for g in range(len(scores)) if include_zero or abs(scores[g]) > 1e-10]
    if strategy == "none":
        return set(groups)
    ranked = sorted(groups, key=lambda g: -scores[g])  # Python's sort is stable
    if strategy == "top_p":
        if rho >= 1:
            return set(groups)
        if prob_mode == "linear":
            threshold = rho * sum(scores[g] for g in groups) - 0.01
            kept, total = [], 0.0
            for g in ranked:
                if threshold <= 0 or total >= threshold or scores[g] <= 0:
                    break
                kept.append(g)
                total += scores[g]
            return set(kept)
        top = max((scores[g] for g in groups), default=0.0)
        weights = [math.exp(scores[g] - top) for g in ranked]
        cumulative = np.cumsum(np.array(weights) / sum(weights)) if weights else np.array([])
        count = int(np.searchsorted(cumulative, rho, side="left")) + 1
        return set(ranked[:count])
    if strategy == "top_k":
        return set(ranked[: max(1, int(rho * len(scores)))])
    if strategy == "top_k_abs":
        return set(ranked[: max(1, int(rho))])
    best = max((scores[g] for g in groups), default=None)
    # In float32 like the scores in the graph: rho * best rounds differently in float64.
    f32 = np.float32
    return {g for g in groups if f32(scores[g]) >= f32(f32(rho) * f32(best)) - f32(1e-10)}


_SELECT = {}


def ours(config, scores):
    if config not in _SELECT:
        _SELECT[config] = jax.jit(lambda s: select_groups(config, s))
    return set(np.flatnonzero(np.asarray(_SELECT[config](jnp.asarray(scores, jnp.float32)))))


# Scores on a coarse grid make ties and exact zeros common, as with real reward stds.
score_lists = st.lists(
    st.one_of(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 5.0, width=32)),
    min_size=NUM_GROUPS,
    max_size=NUM_GROUPS,
)


def _far_from_boundaries(scores, rho, prob_mode):
    """Skip draws where f32 and f64 could disagree on a cumulative sum at the threshold."""
    ranked = sorted(scores, reverse=True)
    if prob_mode == "linear":
        threshold = rho * sum(scores) - 0.01
        sums = np.cumsum(ranked)
        return np.all(np.abs(sums - threshold) > 1e-4)
    top = max(scores)
    weights = np.exp(np.array(ranked) - top)
    return np.all(np.abs(np.cumsum(weights / weights.sum()) - rho) > 1e-4)


@settings(max_examples=150, deadline=None)
@given(
    scores=score_lists,
    rho=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0, 1.5]),
    prob_mode=st.sampled_from(["linear", "softmax"]),
    include_zero=st.booleans(),
)
def test_top_p_matches_reference(scores, rho, prob_mode, include_zero):
    kept_scores = [s for s in scores if include_zero or abs(s) > 1e-10]
    assume(not kept_scores or _far_from_boundaries(kept_scores, rho, prob_mode))
    config = FilterConfig(strategy="top_p", rho=rho, prob_mode=prob_mode, include_zero=include_zero)
    assert ours(config, scores) == reference_select(scores, "top_p", rho, prob_mode, include_zero)


@settings(max_examples=150, deadline=None)
@given(
    scores=score_lists,
    strategy=st.sampled_from(["top_k", "top_k_abs", "min_p", "none"]),
    rho=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.9, 1.0, 3.0, 20.0]),
    include_zero=st.booleans(),
)
def test_other_strategies_match_reference(scores, strategy, rho, include_zero):
    config = FilterConfig(strategy=strategy, rho=rho, include_zero=include_zero)
    assert ours(config, scores) == reference_select(scores, strategy, rho, include_zero=include_zero)


def test_zero_threshold_is_exact_on_float32_scores():
    tiny = float(np.float32(1e-10))  # just above 1e-10: not zero
    below = float(np.nextafter(np.float32(1e-10), np.float32(0)))  # just below: zero
    scores = [0.0] * (NUM_GROUPS - 2) + [below, tiny]
    config = FilterConfig(strategy="top_p", rho=0.0, prob_mode="softmax", include_zero=False)
    assert ours(config, scores) == reference_select(scores, "top_p", 0.0, "softmax", False) == {NUM_GROUPS - 1}


def test_hand_computed_cases():
    scores = [0.0, 2.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.5]  # sum 5, 0.9*5 - 0.01 = 4.49
    assert ours(FilterConfig(), scores) == {1, 2, 3, 4}  # 2 + 1 + 1 = 4 < 4.49, + 0.5 reaches it
    assert ours(FilterConfig(rho=0.5), scores) == {1, 2}  # 2 < 2.49, 2 + 1 = 3 reaches it
    assert ours(FilterConfig(strategy="top_k", rho=0.25), scores) == {1, 2}  # ties: lower index
    assert ours(FilterConfig(strategy="min_p", rho=0.5), scores) == {1, 2, 3}
    assert ours(FilterConfig(strategy="top_k", rho=1.0, include_zero=False), scores) == {1, 2, 3, 4, 7}
    assert ours(FilterConfig(), [0.0] * NUM_GROUPS) == set()  # threshold <= 0 keeps nothing
    assert ours(FilterConfig(rho=1.0, include_zero=False), [0.0] * NUM_GROUPS) == set()


def test_scores_metrics_and_empty_selection_without_nan():
    rewards = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    success = rewards > 0.5
    np.testing.assert_allclose(group_scores(FilterConfig(), rewards), np.std(np.asarray(rewards), axis=1, ddof=1), rtol=1e-6)
    np.testing.assert_allclose(group_scores(FilterConfig(metric="reward_mean"), rewards), [1, 0, 0.5, 1])
    entropy = jnp.arange(4 * 4 * 3, dtype=jnp.float32).reshape(4, 4, 3)
    mask = jnp.ones((4, 4, 3)).at[0, :, 2].set(0)
    got = group_scores(FilterConfig(metric="entropy"), rewards, entropy, mask)
    want = [np.asarray(entropy)[g][np.asarray(mask)[g] > 0].mean() for g in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-6)

    keep, scale, metrics = filter_groups(FilterConfig(loss_scaling="sqrt"), jax.random.key(0), rewards, success)
    std = np.std(np.asarray(rewards), axis=1, ddof=1)
    assert list(np.asarray(keep)) == [False, False, True, True]
    assert float(metrics["filter/zero_variance_all_success"]) == 1
    assert float(metrics["filter/zero_variance_all_fail"]) == 1
    np.testing.assert_allclose(float(metrics["filter/in_group_reward_std_max"]), std.max(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["filter/chosen_group_std"]), std[2:].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(scale), math.sqrt(0.5), rtol=1e-6)

    flat = jnp.ones((4, 4))
    keep, scale, metrics = filter_groups(FilterConfig(loss_scaling="linear"), jax.random.key(0), flat, flat > 0)
    assert not bool(keep.any()) and float(metrics["filter/empty"]) == 1 and float(scale) == 0.0
    assert all(np.isfinite(float(v)) for v in metrics.values())


def test_kept_groups_move_to_the_front_and_bootstrap():
    keep = jnp.array([False, True, False, True, True, False])
    np.testing.assert_array_equal(kept_first(keep), [1, 3, 4, 0, 2, 5])
    assert float(loss_scale(FilterConfig(loss_scaling="linear"), keep)) == 0.5
    config = FilterConfig(bootstrap_fraction=0.5)
    rewards = jnp.zeros((400, 4))  # every group dropped by top_p; about half come back
    kept, _, _ = filter_groups(config, jax.random.key(3), rewards, rewards > 0)
    assert 150 < int(kept.sum()) < 250
    again, _, _ = filter_groups(config, jax.random.key(3), rewards, rewards > 0)
    np.testing.assert_array_equal(kept, again)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"strategy": "top_q"}, "filter.strategy='top_q' is not supported; allowed: top_p"),
        ({"metric": "variance"}, "filter.metric='variance'"),
        ({"prob_mode": "exp"}, "filter.prob_mode='exp'"),
        ({"loss_scaling": "log"}, "filter.loss_scaling='log'"),
        ({"rho": -0.1}, "filter.rho=-0.1 must be >= 0"),
        ({"bootstrap_fraction": 2.0}, "filter.bootstrap_fraction=2.0"),
    ],
)
def test_bad_config_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FilterConfig(**kwargs)


def test_reward_std_with_group_size_one_is_a_config_error():
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        filter_groups(FilterConfig(), jax.random.key(0), jnp.zeros((4, 1)), jnp.zeros((4, 1), bool))
