"""The study's statistics against independent references (scipy, loops in plain Python,
hand-written records), the study's runs as planned (configs built, no training), and a
one-seed, two-step smoke run of benchmarks/reproduce.py (Top-p, Top-k matched to it, report)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as hs
from scipy import stats

from ragen_jax.analysis import study, study_arms, study_jobs, study_report
from ragen_jax.analysis.run_configs import run_config
from ragen_jax.analysis.run_records import last_step, load_runs
from ragen_jax.analysis.study_figures import figure_lines

ROOT = Path(__file__).resolve().parents[2]

values = hs.lists(hs.integers(-5, 5).map(float), min_size=3, max_size=30)


@given(values)
def test_ranks_match_scipy_including_ties(x):
    np.testing.assert_allclose(study.ranks(np.array(x)), stats.rankdata(x))


@pytest.mark.filterwarnings("ignore:An input array is constant")
@given(hs.data())
def test_spearman_matches_scipy(data):
    n = data.draw(hs.integers(3, 30))
    x = data.draw(hs.lists(hs.integers(-4, 4).map(float), min_size=n, max_size=n))
    y = data.draw(hs.lists(hs.floats(-1, 1, allow_nan=False, width=32), min_size=n, max_size=n))
    want = stats.spearmanr(x, y).statistic
    got = study.spearman(np.array(x), np.array(y))
    if np.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, abs=1e-9)


def test_spearman_edge_cases():
    assert study.spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert math.isnan(study.spearman(np.array([1.0, 2.0]), np.array([1.0, 2.0])))
    assert math.isnan(study.spearman(np.ones(5), np.arange(5.0)))
    with pytest.raises(ValueError, match="equal lengths"):
        study.spearman(np.ones(3), np.ones(4))


RECORDS = [
    {"step": 1, "rollout/success": 0.1, "time/step_seconds": 30.0, "filter/kept_ratio": 0.5,
     "mi/collapse_alarm": 0.0, "mi/first_turn/mi_zscore": 2.0, "mi/first_turn/retrieval_acc": 0.5, "mi/first_turn/reasoning_entropy_est": 9.0,
     "grad/bucket0/task_norm": 0.0, "grad/bucket0/reg_norm": 2.0, "grad/bucket0/groups": 3.0,
     "grad/bucket1/task_norm": 4.0, "grad/bucket1/reg_norm": 1.0, "grad/bucket1/groups": 5.0},
    {"step": 2, "rollout/success": 0.2, "time/step_seconds": 10.0, "filter/kept_ratio": 0.25},
    {"step": 3, "rollout/success": 0.3, "time/step_seconds": 12.0, "filter/kept_ratio": 0.75, "val/success": 0.4,
     "mi/collapse_alarm": 1.0,
     "mi/first_turn/mi_zscore": 1.0, "mi/first_turn/retrieval_acc": 0.25, "mi/first_turn/reasoning_entropy_est": 7.0,
     "grad/bucket0/task_norm": 1.0, "grad/bucket0/reg_norm": 2.0, "grad/bucket0/groups": 1.0,
     "grad/bucket1/task_norm": float("nan"), "grad/bucket1/reg_norm": float("nan"), "grad/bucket1/groups": 0.0},
    {"step": 4, "rollout/success": 0.0, "time/step_seconds": 11.0, "filter/kept_ratio": 0.5, "val/success": 0.2},
]


def test_summarise_run_by_hand():
    s = study.summarise_run(RECORDS, last=2)
    assert s["first_success"] == 0.4 and s["final_success"] == pytest.approx(0.3) and s["peak_success"] == 0.4
    assert s["final_mi_zscore"] == pytest.approx(1.5) and s["mean_mi_zscore"] == pytest.approx(1.5)
    assert s["mean_retrieval_acc"] == pytest.approx(0.375) and s["mean_reasoning_entropy"] == pytest.approx(8.0)
    assert s["mean_kept_ratio"] == pytest.approx(0.5)
    assert s["alarm_rate"] == pytest.approx(0.5)  # alarmed at one of the two diagnostic checkpoints
    assert s["mean_step_seconds"] == pytest.approx(11.0)  # step 1 (the compile) left out
    assert s["steps"] == 4
    # without validation, success is the rollout's
    no_val = [{k: v for k, v in r.items() if k != "val/success"} for r in RECORDS]
    assert study.summarise_run(no_val, last=2)["final_success"] == pytest.approx(0.15)
    # the initial policy's validation (step 0) is not one of the run's measurements
    initial = {"step": 0, "val/success": 0.9, "val/pass@k": 0.9}
    assert study.summarise_run([initial, *RECORDS], last=2) == s
    assert study.final_validation([initial, *RECORDS]) == pytest.approx(0.3)


def test_centred_points_subtract_the_same_seed_and_step_mean_by_hand():
    arm_a = [{"step": 1, "mi/first_turn/mi_zscore": 2.0, "rollout/success": 0.1},
             {"step": 2, "mi/first_turn/mi_zscore": 8.0, "rollout/success": 0.5},
             {"step": 3, "mi/first_turn/mi_zscore": 1.0, "rollout/success": 0.2}]  # step 3: only arm a
    arm_b = [{"step": 1, "mi/first_turn/mi_zscore": 4.0, "rollout/success": 0.3},
             {"step": 2, "mi/first_turn/mi_zscore": 6.0, "rollout/success": float("nan")}]
    other_seed = [[{"step": 1, "mi/first_turn/mi_zscore": 10.0, "rollout/success": 0.9}],
                  [{"step": 1, "mi/first_turn/mi_zscore": 20.0, "rollout/success": 0.5}]]
    x, y = study.centred_checkpoint_points([[arm_a, arm_b], other_seed], study.MI_ZSCORE)
    assert x.tolist() == pytest.approx([-1.0, 1.0, -5.0, 5.0])
    assert y.tolist() == pytest.approx([-0.1, 0.1, 0.2, -0.2])


def test_checkpoint_points_and_gradient_buckets_by_hand():
    x, y = study.checkpoint_points([RECORDS, RECORDS[:1]], study.MI_ZSCORE)
    assert x.tolist() == [2.0, 1.0, 2.0] and y.tolist() == [0.1, 0.3, 0.1]
    table = study.gradient_buckets([RECORDS])
    assert [row["bucket"] for row in table] == [0.0, 1.0]
    assert table[0]["task_norm"] == pytest.approx(0.5) and table[0]["reg_norm"] == 2.0
    assert table[0]["groups"] == 2.0 and table[0]["task_over_reg"] == pytest.approx(0.25)
    assert table[1]["task_norm"] == 4.0 and table[1]["groups"] == pytest.approx(2.5)  # NaN norms skipped


def test_figure_lines_average_seeds_and_start_validation_at_the_initial_policy():
    """Two seeds of one arm by hand: validation is the per-step mean over seeds and begins at the
    shared initial policy (step 0); training success is a 5-step moving average."""
    def run(val, train):
        return [{"step": s, study.SUCCESS: t, **({study.VAL_SUCCESS: val[s]} if s in val else {})}
                for s, t in zip(range(1, len(train) + 1), train)]

    arms = {"top_p-grpo": [run({3: 0.4, 6: 0.6}, [0, 0, 0, 0, 1, 1]), run({3: 0.2, 6: 0.4}, [1, 1, 1, 1, 1, 1])]}
    lines = figure_lines(arms, start=0.25)
    steps, values = lines[study.VAL_SUCCESS]["top_p-grpo"]
    assert steps == [0, 3, 6] and np.allclose(values, [0.25, 0.3, 0.5])
    steps, values = lines[study.SUCCESS]["top_p-grpo"]  # per-step means 0.5 0.5 0.5 0.5 1 1
    assert steps == [5, 6] and np.allclose(values, [0.6, 0.7])
    assert lines[study.MI_ZSCORE]["top_p-grpo"] == ([], [])
    steps, _ = figure_lines(arms)[study.VAL_SUCCESS]["top_p-grpo"]
    assert steps == [3, 6]  # no start point when the initial policy's validation is unknown
    # runs that logged their initial policy's validation (step 0) draw it once, as `start`
    logged = {arm: [[{"step": 0, study.VAL_SUCCESS: 0.25}, *records] for records in runs] for arm, runs in arms.items()}
    assert figure_lines(logged, start=0.25) == lines


# ----------------------------------------------------------------------------- the claims' statistics


def percentile(values, q):
    """numpy's default ('linear') percentile, by hand: position (n − 1)·q/100 between the sorted values."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


@given(hs.lists(hs.floats(-1, 1, allow_nan=False, width=32), min_size=2, max_size=12), hs.integers(0, 5))
def test_bootstrap_interval_against_a_loop(values, seed):
    """The mean's percentile interval by hand, with the same draws (numpy's Generator from the
    seed, one (resamples, n) array of indices)."""
    draws = np.random.default_rng(seed).integers(0, len(values), size=(300, len(values)))
    means = [sum(values[i] for i in row) / len(row) for row in draws]
    estimate, low, high = study.bootstrap_interval(values, lambda v: float(np.mean(v)), resamples=300, seed=seed)
    assert estimate == pytest.approx(sum(values) / len(values), abs=1e-12)
    assert low == pytest.approx(percentile(means, 2.5), abs=1e-12)
    assert high == pytest.approx(percentile(means, 97.5), abs=1e-12)


def test_bootstrap_interval_edge_cases_and_coverage():
    assert study.mean_difference_interval([0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)
    assert all(math.isnan(v) for v in study.mean_difference_interval([]))
    # one seed: its difference and no interval (a resample of one unit is that unit again)
    estimate, low, high = study.mean_difference_interval([0.3])
    assert estimate == pytest.approx(0.3) and math.isnan(low) and math.isnan(high)
    # a statistic that is never finite: the estimate and no interval
    estimate, low, high = study.bootstrap_interval([1.0, 2.0], lambda v: math.nan)
    assert math.isnan(estimate) and math.isnan(low) and math.isnan(high)
    # the mean of 20 normal draws: the 95% interval holds the true mean about 95% of the time
    rng = np.random.default_rng(0)
    covered = [low <= 0 <= high for low, high in
               (study.bootstrap_interval(list(rng.normal(size=20)), np.mean, resamples=500, seed=k)[1:]
                for k in range(200))]
    assert 0.85 <= np.mean(covered) <= 0.99


def test_mean_t_interval_against_a_t_table():
    """mean ± t(0.975, n − 1) · sd / √n with sd by a loop and t from a printed table."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}
    for diffs in ([0.1, 0.02], [0.1, 0.09, 0.08], [0.05, -0.01, 0.03, 0.0], [0.009, 0.001, -0.004, 0.012, 0.003]):
        n = len(diffs)
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = table[n - 1] * sd / math.sqrt(n)  # the table's 3 decimals: within 5e-4 · sd
        assert study.mean_t_interval(diffs) == pytest.approx((mean, mean - half, mean + half), abs=5e-4 * sd)
    estimate, low, high = study.mean_t_interval([0.3])
    assert estimate == pytest.approx(0.3) and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in study.mean_t_interval([]))
    assert study.mean_t_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2, 0.2))


def test_mean_t_p_matches_scipy_ttest_1samp():
    from scipy import stats

    rng = np.random.default_rng(5)
    for n in (2, 3, 5, 9):
        diffs = list(rng.normal(0.01, 0.02, n))
        assert study.mean_t_p(diffs) == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
    assert math.isnan(study.mean_t_p([0.2])) and math.isnan(study.mean_t_p([0.1, 0.1]))


def test_holm_by_hand_and_against_a_loop():
    # sorted 0.01, 0.02, 0.03, 0.5 times 4, 3, 2, 1: 0.04, 0.06, 0.06 (not below the one before), 0.5
    assert study.holm([0.5, 0.01, 0.03, 0.02]) == pytest.approx([0.5, 0.04, 0.06, 0.06])
    assert study.holm([0.4, 0.6]) == pytest.approx([0.8, 0.8]) and study.holm([]) == []
    rng = np.random.default_rng(6)
    for m in (1, 3, 11, 13):
        p = list(rng.uniform(0, 0.2, m))
        order = np.argsort(p)
        want = np.empty(m)
        for k, i in enumerate(order):  # step-down: the largest of the scaled p's up to this rank
            want[i] = min(1.0, max((m - j) * p[order[j]] for j in range(k + 1)))
        assert study.holm(p) == pytest.approx(list(want))


@given(hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(-100, 100).map(lambda v: v / 100)), min_size=3, max_size=20))
@example([(3, 0.5), (3, -0.2), (3, 0.1)])  # one x, repeated: 0.1 · 3 is not exact
@example([(0, 0.0), (0, 0.0), (1, 0.01)])  # an exact fit
def test_slope_t_interval_matches_scipy_linregress(points):
    x = [0.1 * a for a, _ in points]
    y = [b for _, b in points]
    slope, low, high = study.slope_t_interval(x, y)
    if len(set(x)) < 2:
        assert all(math.isnan(v) for v in (slope, low, high))
        return
    if len(set(y)) == 1:  # scipy's stderr is undefined here; a flat line fits exactly
        assert (slope, low, high) == (0.0, 0.0, 0.0)
        return
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
    # scipy's stderr goes through r, which loses about half the digits on near-exact fits
    assert (slope, low, high) == pytest.approx((fit.slope, fit.slope - half, fit.slope + half), abs=1e-5)


def test_slope_t_interval_edge_cases():
    assert study.slope_t_interval([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx((2.0, 2.0, 2.0))  # exact line
    slope, low, high = study.slope_t_interval([0.0, 1.0], [0.0, 1.0])
    assert slope == pytest.approx(1.0) and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in study.slope_t_interval([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]))
    assert all(math.isnan(v) for v in study.slope_t_interval([], []))


def test_paired_differences_and_final_validation_by_hand():
    seeds, diffs = study.paired_differences({0: 0.5, 1: 0.4, 2: 0.3, 4: float("nan")}, {1: 0.1, 2: 0.5, 3: 0.9, 4: 0.2})
    assert seeds == [1, 2] and diffs.tolist() == pytest.approx([0.3, -0.2])
    assert study.final_validation(RECORDS, last=2) == pytest.approx(0.3)  # validations 0.4 and 0.2
    assert study.final_validation(RECORDS) == pytest.approx(0.3)  # only two validations
    assert math.isnan(study.final_validation(RECORDS[:2]))  # never validated: no rollout fallback


def test_mid_minus_ends_by_hand_and_against_a_loop():
    # seed 0: mid (0.2, 0.5) means (0.1 + 0.3) / 2 = 0.2, ends (0, 0.9) (0.0 − 0.2) / 2 = −0.1: +0.3;
    # seed 1: 0.0 − 0.1 = −0.1; seed 2 lacks q = 0.9 and drops out
    per_rate = {0.0: {0: 0.0, 1: 0.1, 2: 0.5}, 0.2: {0: 0.1, 1: 0.0, 2: 0.5},
                0.5: {0: 0.3, 1: 0.0, 2: 0.5}, 0.9: {0: -0.2, 1: 0.1}}
    seeds, contrast = study.mid_minus_ends(per_rate, 0.05, 0.5)
    assert seeds == [0, 1] and contrast.tolist() == pytest.approx([0.3, -0.1])
    assert study.mid_minus_ends({0.2: {0: 0.1}, 0.5: {0: 0.2}}, 0.05, 0.5)[0] == []  # no end rate
    rng = np.random.default_rng(7)
    for rates in ((0.0, 0.3), (0.0, 0.1, 0.4, 0.8, 1.0)):
        per_rate = {q: {s: float(v) for s, v in enumerate(rng.normal(0, 0.02, 5))} for q in rates}
        seeds, contrast = study.mid_minus_ends(per_rate, 0.05, 0.5)
        for s, c in zip(seeds, contrast):
            mid = [per_rate[q][s] for q in rates if 0.05 <= q <= 0.5]
            ends = [per_rate[q][s] for q in rates if not 0.05 <= q <= 0.5]
            assert c == pytest.approx(sum(mid) / len(mid) - sum(ends) / len(ends))
    # one rate a side: the contrast is the paired difference of the two rates
    a, b = per_rate[0.1], per_rate[0.8]
    seeds, contrast = study.mid_minus_ends({0.1: a, 0.8: b}, 0.05, 0.5)
    assert contrast.tolist() == pytest.approx(study.paired_differences(a, b)[1].tolist())


def test_verdict_and_matched_top_k():
    assert study.verdict(0.01, 0.2) == "A > B" and study.verdict(-0.3, -0.1) == "A < B"
    assert study.verdict(-0.1, 0.2).startswith("not shown")
    assert study.verdict(math.nan, math.nan).startswith("no interval")
    assert study.matched_top_k([0.4, 0.5], 32) == 14  # 0.45 × 32 = 14.4
    assert study.matched_top_k([0.47, 0.5], 32) == 16  # 15.5 rounds to even
    assert study.matched_top_k([0.001], 32) == 1
    with pytest.raises(ValueError, match="at least one finished Top-p run"):
        study.matched_top_k([], 32)


def synthetic_runs(seed, count=6):
    """Runs whose MI (and an entropy, logged at other steps too) and validation success drift
    together, plus steps with only one of them."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(count):
        level = rng.normal()
        records = []
        for step in range(1, 9):
            r = {"step": step}
            if step % 2 == 0:
                r[study.VAL_SUCCESS] = float(np.clip(0.5 + 0.1 * level + 0.05 * rng.normal(), 0, 1))
            if step % 2 == 0 or step == 3:
                r[study.MI_ZSCORE] = float(level + rng.normal())
            if step % 4 == 0 or step == 5:
                r[study.REASONING_ENTROPY] = float(-level + 2 * rng.normal())
            records.append(r)
        runs.append(records)
    return runs + [[{"step": 1, study.MI_ZSCORE: 1.0}]]  # a run without validation: left out


def centred_by_loops(rows):
    """Each value minus its step's mean over `rows` ([step, values...]), singleton steps dropped."""
    by_step = {}
    for row in rows:
        by_step.setdefault(row[0], []).append(row)
    out = []
    for same in by_step.values():
        if len(same) > 1:
            means = [sum(r[j] for r in same) / len(same) for j in range(1, len(same[0]))]
            out += [[r[0], *(r[j] - means[j - 1] for j in range(1, len(r)))] for r in same]
    return out


@pytest.mark.parametrize("seed, centre", [(0, False), (1, False), (0, True), (1, True)])
def test_run_correlation_resamples_whole_runs_against_scipy(seed, centre):
    runs = synthetic_runs(seed)

    def points(records, keys):
        return [[r["step"], *(r[k] for k in (*keys, study.VAL_SUCCESS))] for r in records
                if all(k in r for k in (*keys, study.VAL_SUCCESS))]

    for against in (None, study.REASONING_ENTROPY):
        keys = (study.MI_ZSCORE,) if against is None else (study.MI_ZSCORE, against)
        per_run = [p for p in (points(r, keys) for r in runs) if p]

        def pooled(chosen):
            rows = [row for run in chosen for row in run]
            flat = np.array(centred_by_loops(rows) if centre else rows)
            rho = stats.spearmanr(flat[:, 1], flat[:, -1]).statistic
            return rho if against is None else abs(rho) - abs(stats.spearmanr(flat[:, 2], flat[:, -1]).statistic)

        draws = np.random.default_rng(seed).integers(0, len(per_run), size=(200, len(per_run)))
        values = [pooled([per_run[i] for i in row]) for row in draws]
        values = [v for v in values if np.isfinite(v)]
        got = study.run_correlation(runs, study.MI_ZSCORE, against=against, resamples=200, seed=seed, centre=centre)
        assert got[0] == pytest.approx(pooled(per_run), abs=1e-9)
        assert got[1] == pytest.approx(percentile(values, 2.5), abs=1e-9)
        assert got[2] == pytest.approx(percentile(values, 97.5), abs=1e-9)
        assert got[3:] == (sum(len(p) for p in per_run), 6)
    assert study.run_correlation(runs, "mi/first_turn/no_such_key")[3:] == (0, 0)
    # one run: its points' correlation and no interval (resampling one run repeats it)
    rho, low, high, points, n = study.run_correlation(runs[:1], study.MI_ZSCORE)
    assert math.isfinite(rho) and math.isnan(low) and math.isnan(high) and n == 1 and points > 2


def test_reg_share_by_hand():
    steps = study.measured_steps([RECORDS])
    assert [r["step"] for r in steps] == [1, 3]
    assert study.reg_share(steps, 0) == pytest.approx(2.0 / (2.0 + 0.5))  # reg 2, 2; task 0, 1
    assert study.reg_share(steps, 1) == pytest.approx(1.0 / (1.0 + 4.0))  # the NaN step left out
    assert math.isnan(study.reg_share(steps, 7))
    # no task gradient at all (GRPO's groups without reward variance): the regulariser is all of it
    only_reg = [{"grad/bucket0/task_norm": 0.0, "grad/bucket0/reg_norm": r} for r in (0.3, 0.1)]
    assert study.reg_share(only_reg, 0) == 1.0
    assert math.isnan(study.reg_share([{"grad/bucket0/task_norm": 0.0, "grad/bucket0/reg_norm": 0.0}], 0))
    table = study.gradient_buckets([RECORDS])
    assert (table[0]["measurements"], table[0]["groups_total"]) == (2.0, 4.0)
    assert (table[1]["measurements"], table[1]["groups_total"]) == (2.0, 5.0)


# ----------------------------------------------------------------------------- the study's runs


def study_args(out=Path("unused"), **fields):
    return study_arms.Study(out=out, **fields)


def built(env, overrides):
    from ragen_jax.run import config as config_lib

    return config_lib.build(run_config(env, 0, overrides), 1).step


def test_every_main_and_noise_run_takes_the_papers_filter_and_meets_mi_at_validation():
    args = study_args()
    for env, steps in (("sokoban", 400), ("frozenlake", 140)):
        config = run_config(env, 0, study_arms.study_overrides(env, args))
        step = built(env, study_arms.study_overrides(env, args))
        assert (step.filter.metric, step.filter.update, step.total_steps) == ("reward_var", "paper", steps)
        assert step.diagnostics.num_samples == 64 and config.train.val_every % step.diagnostics.compute_freq == 0
        assert (config.early_stop.val_patience, config.early_stop.empty_batches) == (0, 0)
    arms = study_arms.noise_arms(args)
    assert [arm for arm, _ in arms] == [f"{f}-grpo{s}" for s in ("-success1", "-success0.9", "", "-success0.6",
                                                                 "-success0.333") for f in ("top_p", "none")]
    for (arm, overrides), rate in zip(arms, [1.0, 1.0, 0.9, 0.9, 0.8, 0.8, 0.6, 0.6, 1 / 3, 1 / 3]):
        config = run_config("frozenlake", 0, overrides)
        assert config.env.success_rate == rate and config.filter.strategy == arm.split("-")[0]
    main_top_p = run_config("frozenlake", 0, {**study_arms.study_overrides("frozenlake", args),
                                              "algo.name": "grpo", **study_arms.FILTERS["top_p"]})
    assert run_config("frozenlake", 0, dict(arms[4][1])).to_dict() == main_top_p.to_dict()  # rate 0.8: main's


def test_reward_noise_arms_run_the_papers_lake_at_each_noise_and_the_trend_pairs_them():
    args = study_args(part="reward_noise")
    arms = study_arms.reward_noise_arms(args)
    assert [arm for arm, _ in arms] == [f"{f}-grpo-rnoise{q}" for q in ("0", "0.2", "0.5", "0.9")
                                        for f in ("top_p", "none")]
    for (arm, overrides), q in zip(arms, [0, 0, 0.2, 0.2, 0.5, 0.5, 0.9, 0.9]):
        config = run_config("frozenlake_paper", 0, overrides)
        step = built("frozenlake_paper", overrides)
        assert (config.env.success_rate, step.reward_noise, step.filter.update) == (0.98, q, "paper")
        assert config.filter.strategy == arm.split("-")[0] and step.algo.name == "grpo"
    # Top-p − none per seed: +0.10, +0.11, +0.12 at q = 0, −0.10, −0.09, −0.08 at q = 0.5: the slope
    # is −0.4 per unit; at each rate sd 0.01, t(0.975, 2) 4.303: ±0.025; t = 0.11 / (0.01 / √3) = 19.05 and
    # 0.09 / (0.01 / √3) = 15.59, two-sided p with 2 df 0.0027 and 0.0041 (1 − 1 / √(1 + 2 / t²))
    record = lambda v: [{"step": s, "val/success": v} for s in (100, 120, 140)]
    runs = {("frozenlake_paper", f"{f}-grpo-rnoise{q}"): {seed: record(v + 0.01 * seed * (f == "top_p"))
                                                          for seed in range(3)}
            for q, top_p in (("0", 0.6), ("0.5", 0.4)) for f, v in (("top_p", top_p), ("none", 0.5))}
    text = study_report.reward_noise_trend(runs)
    assert ("q = 0: +0.110 (3 seeds), t 95% [+0.085, +0.135], p 0.0027; "
            "q = 0.5: -0.090 (3 seeds), t 95% [-0.115, -0.065], p 0.0041") in text
    assert "6 seed pairs: -0.400 per unit" in text and "falls with the noise" in text
    # mid (0.5) − ends (0) per seed: −0.1 + 0.01 s − (0.1 + 0.01 s) = −0.2 at every seed, no spread
    assert "Mid-range (0.05 ≤ q ≤ 0.5) − the other rates, per seed at every rate: -0.200 (3 seeds)" in text
    assert "the gain is lower mid-range" in text
    runs[("frozenlake_paper", "top_p-grpo-rnoise0.5")][2] = record(0.45)  # seed 2: −0.05 − 0.12 = −0.17
    # −0.2, −0.2, −0.17: sd 0.0173, t 95% ± 4.303 · 0.0173 / √3 = ±0.043 around −0.19; t −19, p 0.0028
    assert ("per seed at every rate: -0.190 (3 seeds), t 95% [-0.233, -0.147], p 0.0028: the gain is lower mid-range"
            in study_report.reward_noise_trend(runs))
    one_seed = {key: {0: seeds[0]} for key, seeds in runs.items()}
    assert "q = 0: +0.100 (1 seeds); q = 0.5: -0.100 (1 seeds)." in study_report.reward_noise_trend(one_seed)
    assert study_args(part="reward_noise", reward_noise=["1.5"]).error() == (
        "--reward-noise '1.5': expected a chance in [0, 1], e.g. 0.2")


def test_gradient_arms_set_the_regularisers_and_measure_every_five_steps():
    arms = study_arms.gradient_arms(study_args(envs=["sokoban"]))
    assert [arm for _, arm, _ in arms] == ["none-ppo-ent0.001-kl0.01", "none-ppo-ent0.01-kl0.1",
                                           "none-grpo-ent0.001-kl0.01", "none-grpo-ent0.01-kl0.1"]
    for env, _, overrides in arms:
        step = built(env, overrides)
        assert step.grad_buckets == 6 and step.diagnostics is None and step.grad_every == 5
        assert (step.algo.entropy_coef, step.algo.kl_coef) in ((0.001, 0.01), (0.01, 0.1))
        assert step.filter.strategy == "none" and step.total_steps == 50
        assert step.rollout.num_groups * (step.total_steps // step.grad_every + 1) / 6 >= 32  # groups per bucket


def fake_run(workdir, steps, records):
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps({"train": {"steps": steps}}))
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_top_k_is_matched_to_the_finished_top_p_runs_and_then_fixed(tmp_path):
    with pytest.raises(SystemExit, match="run --filters top_p first"):
        study_arms.matched_k(tmp_path, "sokoban", "grpo", 32)
    arm = tmp_path / "sokoban" / "top_p-grpo"
    fake_run(arm / "seed0", 2, [{"step": 1, "filter/kept_ratio": 0.5}, {"step": 2, "filter/kept_ratio": 0.25}])
    fake_run(arm / "seed1", 2, [{"step": 1, "filter/kept_ratio": 0.5}, {"step": 2, "filter/kept_ratio": 0.5}])
    fake_run(arm / "seed2", 3, [{"step": 1, "filter/kept_ratio": 1.0}])  # unfinished: left out
    assert study_arms.matched_k(tmp_path, "sokoban", "grpo", 32) == 14  # (0.375 + 0.5) / 2 × 32 = 14
    fake_run(arm / "seed3", 1, [{"step": 1, "filter/kept_ratio": 1.0}])
    assert study_arms.matched_k(tmp_path, "sokoban", "grpo", 32) == 14  # fixed once the first Top-k run asked
    saved = json.loads((tmp_path / "sokoban" / "top_k-grpo" / "matched.json").read_text())
    assert saved["top_p_runs"] == 2 and saved["top_p_mean_kept_fraction"] == pytest.approx(0.4375)


def test_parallel_study_plans_each_unfinished_run_once_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(study_jobs.os, "cpu_count", lambda: 8)  # 4 jobs: 2 cores, so 2 jax CPU devices, each
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    args = study_args(tmp_path, jobs=4, envs=["frozenlake"], overrides={"mesh.data": "-1"})
    fake_run(tmp_path / "frozenlake" / "none-grpo" / "seed1", 2, [{"step": 2}])  # finished: not planned again
    planned = study_jobs.study_jobs(args, ("main", "noise", "gradients"), Path("reproduce.py"))
    jobs = {job.name: job for job in planned}
    main = [f"frozenlake/{f}-grpo/seed{s}" for f in ("top_p", "none", "top_k") for s in range(5)]
    main.remove("frozenlake/none-grpo/seed1")
    noise = [f"frozenlake/{f}-grpo-success{r}/seed{s}" for r in ("1", "0.9", "0.6", "0.333")
             for f in ("top_p", "none") for s in range(3)]  # rate 0.8: main's runs, not twice
    gradients = [f"frozenlake/none-{a}-ent{r}/seed0" for a in ("ppo", "grpo") for r in ("0.001-kl0.01", "0.01-kl0.1")]
    assert list(jobs) == main + noise + gradients
    first, second, other = (jobs[f"frozenlake/{arm}/seed{s}"]
                            for arm, s in (("top_p-grpo", 0), ("top_p-grpo", 1), ("none-grpo", 0)))
    assert first.ready({}) and not second.ready({}) and not other.ready({})  # the first validates the start
    (tmp_path / "frozenlake" / "start_validation.json").write_text("{}")
    assert other.ready({}) and not second.ready({})  # the first of its arm; the second waits for its compile
    fake_run(tmp_path / "frozenlake" / "top_p-grpo" / "seed0", 140, [{"step": 0}, {"step": 1}])
    assert second.ready({})
    (tmp_path / "frozenlake" / "top_p-grpo" / "seed0" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert last_step(tmp_path / "frozenlake" / "top_p-grpo" / "seed0") == 1  # a line being written
    assert jobs[noise[1]].ready({first.name: 0}) is False and jobs[noise[1]].ready({noise[0]: 1})  # ended: go on
    assert jobs["frozenlake/top_k-grpo/seed3"].after == tuple(f"frozenlake/top_p-grpo/seed{s}" for s in range(5))
    assert jobs["frozenlake/none-grpo/seed0"].after == () and noise[0] in jobs and not jobs[noise[0]].after
    argv = jobs["frozenlake/top_k-grpo/seed3"].argv
    assert argv[2:12] == ["study", "--part", "main", "--envs", "frozenlake", "--algos", "grpo", "--filters", "top_k",
                          "--seeds"] and argv[12] == "3" and argv[-2:] == ["--set", "mesh.data=-1"]
    assert jobs[noise[-1]].argv[5:9] == ["--rates", "1/3", "--filters", "none"]
    assert argv[1] == "reproduce.py"  # each job is the study's script for its run alone
    environ = jobs[main[0]].env
    assert environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert environ["XLA_FLAGS"] == "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=2"


def test_report_pairs_the_seeds_of_arms_that_differ_only_in_the_filter(tmp_path):
    finals = {"top_p": [0.50, 0.46, 0.48], "none": [0.40, 0.37, 0.40], "top_k": [0.45, 0.45, 0.47]}
    for name, values in finals.items():
        for seed, value in enumerate(values):
            records = [{"step": 1, study.MI_ZSCORE: seed + value, study.VAL_SUCCESS: value - 0.1},
                       {"step": 2, study.MI_ZSCORE: 2.0 * value, study.VAL_SUCCESS: value}]
            fake_run(tmp_path / "sokoban" / f"{name}-grpo" / f"seed{seed}", 2, records)
    fake_run(tmp_path / "sokoban" / "none-grpo-success0.6" / "seed0", 2, [{"step": 2, study.VAL_SUCCESS: 0.1}])
    text = study_report.report_text(load_runs(tmp_path), tmp_path)
    diffs = np.array(finals["top_p"]) - np.array(finals["none"])  # one validation at the end: the run's final
    finals_mean = [np.mean([v - 0.1, v]) for v in finals["top_p"]]  # the mean of its last 3 (two here)
    assert f"| {np.mean(finals_mean):.3f} (" in text  # the top_p row's final validation
    row = next(line for line in text.splitlines() if "| top_p − none |" in line)
    mean, low, high = study.mean_difference_interval(diffs)
    _, t_low, t_high = study.mean_t_interval(diffs)
    assert row.startswith("| sokoban | grpo | top_p − none | 3 | 0: +0.100, 1: +0.090, 2: +0.080 |")
    assert f"| {mean:+.3f} | [{low:+.3f}, {high:+.3f}] | [{t_low:+.3f}, {t_high:+.3f}] | top_p better |" in row
    # differences +0.05, +0.01, +0.01: the bootstrap's interval (their range) excludes 0, t's does not
    row = next(line for line in text.splitlines() if "| top_p − top_k |" in line)
    assert "| [+0.010, +0.050] |" in row and row.endswith("| not shown (the interval spans 0) |")
    assert "| top_k − none |" in text
    assert "grpo-success0.6 | top_p" not in text  # no Top-p at that rate: nothing to pair
    assert f"| {study.MI_ZSCORE} | 18 | 9 |" in text  # 2 points in each of the 9 runs with both
    assert "| sign | centred | 95% interval | sign |" in text  # and each centred on the step


def test_report_fits_the_filters_difference_against_the_slip_over_the_noise_rates(tmp_path):
    """Top-p − none per seed at the config's rate (main's arms, slip 0.2) and at two noise rates,
    regressed on the slip; arms without a partner or of another algorithm are left out."""
    finals = {"": ([0.60, 0.62], [0.59, 0.60]), "-success1": ([0.72, 0.74, 0.71], [0.70, 0.73, 0.71]),
              "-success0.333": ([0.25, 0.26], [0.27, 0.27])}
    for suffix, arms in finals.items():
        for name, values in zip(("top_p", "none"), arms):
            for seed, value in enumerate(values):
                fake_run(tmp_path / "frozenlake" / f"{name}-grpo{suffix}" / f"seed{seed}", 2,
                         [{"step": 2, study.VAL_SUCCESS: value}])
    fake_run(tmp_path / "frozenlake" / "top_p-grpo-success0.6" / "seed0", 2, [{"step": 2, study.VAL_SUCCESS: 0.9}])
    fake_run(tmp_path / "frozenlake" / "top_p-ppo" / "seed0", 2, [{"step": 2, study.VAL_SUCCESS: 0.9}])
    fake_run(tmp_path / "frozenlake" / "none-ppo" / "seed0", 2, [{"step": 2, study.VAL_SUCCESS: 0.1}])
    slips = [0.2, 0.2, 0.0, 0.0, 0.0, 1 - 0.333, 1 - 0.333]
    diffs = [0.01, 0.02, 0.02, 0.01, 0.0, -0.02, -0.01]
    fit = stats.linregress(slips, diffs)
    half = stats.t.ppf(0.975, len(slips) - 2) * fit.stderr
    line = next(line for line in study_report.report_text(load_runs(tmp_path), tmp_path).splitlines()
                if line.startswith("Stochasticity"))
    assert "over 7 seed pairs at 3 rates" in line
    assert f"slope {fit.slope:+.3f} per unit of slip, t 95% [{fit.slope - half:+.3f}, {fit.slope + half:+.3f}]" in line
    assert line.endswith("the filter's difference falls with the slip")


def test_reproduce_study_smoke(tmp_path, capsys):
    """One seed, two steps, one arm as a parallel job (its log in logs/): the run lands where
    `report` finds it, with the paper's filter, and the report and figure come from it. (Top-k's
    matching to Top-p and the jobs' order are tested without training, above.)"""
    script = str(ROOT / "benchmarks" / "reproduce.py")
    sets = [a for kv in TINY for a in ("--set", kv)]
    run = subprocess.run([sys.executable, script, "study", "--part", "main", "--envs", "sokoban", "--algos", "grpo",
                          "--filters", "top_p", "--seeds", "0", "--jobs", "2", "--steps", "2",
                          "--val-every", "2",
                          "--eval-episodes", "2", "--eval-samples", "1", "--diag-samples", "4", "--out", str(tmp_path),
                          *sets], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    arm = tmp_path / "sokoban"
    records = [json.loads(line) for line in (arm / "top_p-grpo" / "seed0" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [0, 1, 2] and study.VAL_SUCCESS in records[-1]
    saved = json.loads((arm / "top_p-grpo" / "seed0" / "config.json").read_text())
    assert (saved["filter"]["metric"], saved["filter"]["update"], saved["train"]["save_every"]) == (
        "reward_var", "paper", 10)
    start = json.loads((arm / "start_validation.json").read_text())
    assert 0.0 <= start["success"] <= 1.0
    assert "| sokoban | top_p-grpo | 1 |" in (tmp_path / "report.md").read_text()
    assert "done sokoban/top_p-grpo/seed0" in run.stdout
    assert (tmp_path / "logs" / "sokoban-top_p-grpo-seed0.log").stat().st_size > 0
    study_report.report(tmp_path, tmp_path / "fig")
    out = capsys.readouterr().out
    assert "| sokoban | top_p-grpo | 1 |" in out
    assert "| sokoban (initial policy of every arm) |" in out
    assert (tmp_path / "fig" / "study_sokoban.png").stat().st_size > 0


TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens=8",
        "algo.mini_batch_size=4", "diagnostics.per_turn_samples=2", "diagnostics.compute_freq=1", "mesh.data=1"]


@pytest.mark.parametrize("script, args, line", [
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--eval-samples", "0"],
     "reproduce.py: error: --eval-samples=0 must be >= 1"),
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--eval-episodes", "0"],
     "reproduce.py: error: --eval-episodes=0 must be >= 1"),
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--set", "rollout.num_groups"],
     "reproduce.py: error: --set 'rollout.num_groups': expected KEY=VALUE"),
    ("reproduce.py", ["study", "--out", "unused", "--rates", "1.5"],
     "reproduce.py: error: --rates '1.5': expected a success rate in [0, 1], e.g. 0.9 or 1/3"),
    ("reproduce.py", ["study", "--out", "unused", "--reg", "0.01"],
     "reproduce.py: error: --reg '0.01': expected ENTROPY:KL coefficients >= 0, e.g. 0.001:0.01"),
    ("reproduce.py", ["study", "--out", "unused", "--jobs", "0"], "reproduce.py: error: --jobs=0 must be >= 1"),
    ("reproduce.py", ["study", "--out", "unused", "--part", "recorded", "--jobs", "2"],
     "reproduce.py: error: --jobs applies to the parts main, noise, gradients and all; recorded runs one at a time"),
    ("sft_fit_speed.py", ["--set", "rollout.max_turns"],
     "sft_fit_speed.py: error: --set 'rollout.max_turns': expected KEY=VALUE"),
    ("step_time.py", ["--steps", "0"], "step_time.py: error: --steps=0 must be >= 1"),
    ("step_time.py", ["--set", "algo.micro_batch_size"],
     "step_time.py: error: --set 'algo.micro_batch_size': expected KEY=VALUE"),
    ("lora_cost.py", ["--rank", "0"], "lora_cost.py: error: --rank=0 must be >= 1"),
])
def test_benchmark_scripts_reject_bad_arguments_in_one_line(script, args, line):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == line, run.stderr[-500:]
