"""SNR-aware filtering against a plain NumPy/Python reading of
docs/method.md#strategies-and-tie-rules, on random scores."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ragen_jax.rl.filtering import (FilterConfig, filter_groups, group_scores, kept_first, loss_scale, select_groups,
                                    step_loss_scale, step_rows, update_steps)

NUM_GROUPS = 8


def reference_select(scores, strategy, rho, prob_mode="linear", include_zero=True):
    """docs/method.md#strategies-and-tie-rules as a loop over Python floats: the list of kept
    group indices."""
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
    std = np.std(np.asarray(rewards), axis=1, ddof=1)
    np.testing.assert_allclose(group_scores(FilterConfig(metric="reward_std"), rewards), std, rtol=1e-6)
    np.testing.assert_allclose(group_scores(FilterConfig(), rewards), std**2, rtol=1e-6)
    np.testing.assert_allclose(group_scores(FilterConfig(metric="reward_mean"), rewards), [1, 0, 0.5, 1])
    entropy = jnp.arange(4 * 4 * 3, dtype=jnp.float32).reshape(4, 4, 3)
    mask = jnp.ones((4, 4, 3)).at[0, :, 2].set(0)
    got = group_scores(FilterConfig(metric="entropy"), rewards, entropy, mask)
    want = [np.asarray(entropy)[g][np.asarray(mask)[g] > 0].mean() for g in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-6)

    keep, scale, metrics = filter_groups(FilterConfig(loss_scaling="sqrt"), jax.random.key(0), rewards, success)
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
        ({"ddof": -1}, r"filter.ddof=-1 must be an integer >= 0"),
        ({"ddof": 0.5}, r"filter.ddof=0.5 must be an integer >= 0"),
        ({"update": "fewer"}, "filter.update='fewer' is not supported; allowed: paper, fewer_steps"),
    ],
)
def test_bad_config_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FilterConfig(**kwargs)


@pytest.mark.parametrize("metric", ["reward_var", "reward_std"])
def test_reward_spread_with_group_size_one_is_a_config_error(metric):
    with pytest.raises(ValueError, match=f"filter.metric='{metric}' with filter.ddof=1 needs group_size > 1"):
        filter_groups(FilterConfig(metric=metric), jax.random.key(0), jnp.zeros((4, 1)), jnp.zeros((4, 1), bool))
    FilterConfig(metric=metric, ddof=0).check_group_size(1)  # the population variance of one reward: 0


# ----------------------------------------------------------------------------- variance mass (the paper's score)


def reference_variance(values, ddof=1):
    """The sample variance in Python floats; a group of equal rewards has none."""
    if len(set(values)) == 1:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / (len(values) - ddof)


# Rewards as the envs give them: success bonuses, move penalties, format penalties (none of
# −0.1, 0.9, 10.9, 9.4 is exact in binary), so ties and equal-reward groups are common.
REWARDS = [0.0, 1.0, -0.1, 0.9, 10.9, 9.4, -1.0, 0.3]
reward_groups = st.lists(st.lists(st.sampled_from(REWARDS), min_size=4, max_size=4), min_size=NUM_GROUPS,
                         max_size=NUM_GROUPS)


@settings(max_examples=100, deadline=None)
@given(groups=reward_groups, ddof=st.sampled_from([0, 1, 2]))
def test_variance_and_std_scores_match_python(groups, ddof):
    rewards = jnp.asarray(groups, jnp.float32)
    as_f32 = [[float(np.float32(v)) for v in g] for g in groups]  # what the graph sees
    want = np.array([reference_variance(g, ddof) for g in as_f32])
    got_var = np.asarray(group_scores(FilterConfig(metric="reward_var", ddof=ddof), rewards))
    got_std = np.asarray(group_scores(FilterConfig(metric="reward_std", ddof=ddof), rewards))
    np.testing.assert_allclose(got_var, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_std, np.sqrt(want), rtol=1e-5, atol=1e-6)
    assert np.all((got_var == 0) == (want == 0))  # exactly the equal-reward groups score 0


def _safe_for_float32(scores, rho):
    """Skip draws where float32 rounding could move a group across the Top-p cut: a cumulative
    sum within rounding of the threshold, or two nearly equal scores on either side of it."""
    ranked = sorted(scores, reverse=True)
    total = sum(scores)
    tolerance = 1e-5 * (1.0 + total)
    threshold = rho * total - 0.01
    if np.any(np.abs(np.cumsum(ranked) - threshold) <= tolerance):
        return False
    kept = reference_select(scores, "top_p", rho)
    return not any(abs(scores[a] - scores[b]) <= tolerance and (a in kept) != (b in kept)
                   for a in range(len(scores)) for b in range(len(scores)))


@settings(max_examples=150, deadline=None)
@given(groups=reward_groups, rho=st.sampled_from([0.1, 0.5, 0.7, 0.9, 0.99]), include_zero=st.booleans())
def test_top_p_accumulates_variance_mass_as_the_paper(groups, rho, include_zero):
    """The paper's rule end to end, from rewards: sample variance per group (ddof 1), sorted
    descending with stable ties, the shortest prefix reaching ρ·Σ − ε, stopping at a score ≤ 0."""
    scores = [reference_variance([float(np.float32(v)) for v in g]) for g in groups]
    assume(_safe_for_float32([s for s in scores if include_zero or s > 1e-10], rho))
    rewards = jnp.asarray(groups, jnp.float32)
    keep, _, _ = filter_groups(FilterConfig(rho=rho, include_zero=include_zero), jax.random.key(0), rewards,
                               rewards > 5)
    assert set(np.flatnonzero(np.asarray(keep))) == reference_select(scores, "top_p", rho, include_zero=include_zero)


def test_variance_mass_keeps_fewer_low_variance_groups_than_std_by_hand():
    """Four groups of 4: variances 4, 4/3, 1/4, 0 (stds 2, 1.155, 0.5, 0). At ρ 0.9 the variance
    threshold is 0.9 · 5.583 − 0.01 = 5.015: 4 < 5.015, 4 + 4/3 reaches it → groups 0 and 1. On
    the std the threshold is 0.9 · 3.655 − 0.01 = 3.279: 2 + 1.155 = 3.155 falls short → group 2
    is kept as well."""
    rewards = jnp.array([[0.0, 0.0, 0.0, 4.0], [0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_allclose(group_scores(FilterConfig(), rewards), [4.0, 4 / 3, 0.25, 0.0], rtol=1e-6)
    for metric, want in (("reward_var", [0, 1]), ("reward_std", [0, 1, 2])):
        keep, _, _ = filter_groups(FilterConfig(metric=metric), jax.random.key(0), rewards, rewards > 3)
        assert list(np.flatnonzero(np.asarray(keep))) == want, metric
    # ddof 0 divides by 4 instead of 3: the same order, so the same groups
    np.testing.assert_allclose(group_scores(FilterConfig(ddof=0), rewards), [3.0, 1.0, 0.1875, 0.0], rtol=1e-6)


def test_the_earlier_metric_name_reads_as_the_std():
    config = FilterConfig(metric="reward_variance")
    assert config.metric == "reward_std" and config == FilterConfig(metric="reward_std")


# ----------------------------------------------------------------------------- the zero that is zero


def test_equal_rewards_that_are_not_exact_in_binary_are_dropped_and_counted():
    """The minimal case: five rewards of 10.9 (a solved Sokoban level) and a group of 0/1 rewards.
    With `include_zero=False` and no strategy only the second is kept, and the first counts as an
    all-success zero-variance group."""
    rewards = jnp.array([[10.9] * 5, [0.0, 1.0, 0.0, 1.0, 0.0]], jnp.float32)
    success = jnp.array([[True] * 5, [False] * 5])
    for metric in ("reward_var", "reward_std"):
        keep, _, metrics = filter_groups(FilterConfig(metric=metric, strategy="none", include_zero=False),
                                         jax.random.key(0), rewards, success)
        assert list(np.asarray(keep)) == [False, True], metric
        assert float(metrics["filter/zero_variance_all_success"]) == 1
        assert float(metrics["filter/zero_variance_all_fail"]) == 0
        assert float(metrics["filter/in_group_reward_std_mean"]) == pytest.approx(np.std([0, 1, 0, 1, 0], ddof=1) / 2)


@settings(max_examples=200, deadline=None)
@given(tenths=st.lists(st.integers(-150, 150), min_size=3, max_size=3), size=st.integers(2, 9),
       dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
       metric=st.sampled_from(["reward_var", "reward_std"]))
def test_a_group_of_equal_rewards_scores_exactly_zero(tenths, size, dtype, metric):
    """Multiples of 0.1 (rarely exact in binary): a group of one repeated value scores exactly
    0.0 in every dtype, so `include_zero=False` drops it; a group with two different values
    scores above the zero test and is kept. Group 2 is all-fail when its value is ≤ 0."""
    a, b, c = (t / 10 for t in tenths)
    assume(jnp.asarray(a, dtype) != jnp.asarray(b, dtype))
    rewards = jnp.asarray([[a] * size, [a] * (size - 1) + [b], [c] * size], dtype)
    scores = np.asarray(group_scores(FilterConfig(metric=metric), rewards))
    assert scores[0] == 0.0 and scores[2] == 0.0 and scores[1] > 1e-10
    success = jnp.asarray(rewards, jnp.float32) > 0
    keep, _, metrics = filter_groups(FilterConfig(metric=metric, strategy="none", include_zero=False),
                                     jax.random.key(0), rewards, success)
    assert list(np.asarray(keep)) == [False, True, False]
    zero_success = int(float(jnp.asarray(a, dtype)) > 0) + int(float(jnp.asarray(c, dtype)) > 0)
    zero_fail = int(float(jnp.asarray(a, dtype)) <= 0) + int(float(jnp.asarray(c, dtype)) <= 0)
    assert float(metrics["filter/zero_variance_all_success"]) == zero_success
    assert float(metrics["filter/zero_variance_all_fail"]) == zero_fail


# ----------------------------------------------------------------------------- the update's plan


PLANS = [(16, 4), (16, 16), (16, 2), (24, 8), (128, 64), (128, 8)]  # (batch, mini_batch)


@pytest.mark.parametrize("update", ["paper", "fewer_steps"])
def test_update_plan_covers_the_kept_rows_as_each_mode_says(update):
    """For every kept-row count of each batch: the steps' rows are consecutive slices that cover
    [0, kept) once, each at most a minibatch. `paper`: batch / mini_batch steps whatever is kept
    (or one a row when fewer rows are kept), sizes within one row of each other. `fewer_steps`:
    full minibatches, the last one partial."""
    config = FilterConfig(update=update)
    for batch, mb in PLANS:
        plan = jax.jit(lambda kept: (lambda steps: (steps, jax.vmap(
            lambda i: jnp.stack(step_rows(config, i, steps, kept, mb)))(jnp.arange(batch))))(
            update_steps(config, kept, batch, mb)))
        for kept in range(batch + 1):
            steps, bounds = plan(jnp.int32(kept))
            steps = int(steps)
            bounds = [tuple(int(x) for x in row) for row in np.asarray(bounds)[:steps]]
            sizes = [end - start for start, end in bounds]
            assert [start for start, _ in bounds] == ([0] + [end for _, end in bounds[:-1]])[:steps]
            assert sum(sizes) == kept and all(0 < s <= mb for s in sizes), (batch, mb, kept, bounds)
            if update == "paper":
                assert steps == min(batch // mb, kept)
                assert max(sizes, default=0) - min(sizes, default=0) <= 1
            else:
                assert steps == math.ceil(kept / mb) and all(s == mb for s in sizes[:-1])


def test_the_paper_modes_loss_scale_is_each_steps_keep_ratio():
    """`paper`: the step's own rows / minibatch (linear) or its square root; their mean over the
    steps is the batch's keep ratio. `fewer_steps`: the batch's scale in every step."""
    batch, mb, kept = 128, 64, 52  # two steps of 26 rows: each 26/64 of a minibatch
    scale = jnp.float32(0.25)
    for loss_scaling, want in (("none", 1.0), ("linear", 26 / 64), ("sqrt", math.sqrt(26 / 64))):
        config = FilterConfig(loss_scaling=loss_scaling)
        steps = update_steps(config, jnp.int32(kept), batch, mb)
        got = [float(step_loss_scale(config, scale, jnp.subtract(*step_rows(config, i, steps, kept, mb)[::-1]), mb))
               for i in range(int(steps))]
        assert got == pytest.approx([want, want])
        assert float(step_loss_scale(FilterConfig(loss_scaling=loss_scaling, update="fewer_steps"), scale,
                                     jnp.int32(26), mb)) == 0.25
    linear = FilterConfig(loss_scaling="linear")
    uneven = [float(step_loss_scale(linear, scale, jnp.int32(rows), 8)) for rows in (1, 2, 1, 2, 1, 2, 1, 2)]
    assert np.mean(uneven) == pytest.approx(12 / 64)  # 12 kept rows of a 64-row batch in 8 steps
