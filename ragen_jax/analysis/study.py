"""Statistics over finished training runs, for the reproduction study (benchmarks/reproduce.py).

Everything here reads `metrics.jsonl` records (one dict per logged step, as `train` writes
them) and returns plain numbers, so the study's tables can be recomputed from the logs alone.
A run's step 0 (its initial policy's validation) is not one of its measurements: the study
records the initial policy once, in start_validation.json.

- `summarise_run`: one run's row of the results table (final / peak success, MI-ZScore,
  retrieval accuracy, reasoning entropy, collapse alarms, kept ratio, step time);
- `checkpoint_points` + `spearman`: the paper's "MI-ZScore vs success" and "reasoning entropy vs
  success" rank correlations across runs and diagnostic checkpoints; `centred_checkpoint_points`
  the same with each checkpoint centred on the runs that saw the same levels;
- `gradient_buckets`: task- and regularisation-gradient norms by reward-std bucket;
- the claims: `final_validation` (a run's validation success at its end, fixed levels),
  `paired_differences` (arm A − arm B per seed, the same seed in both), `bootstrap_interval`
  (percentile bootstrap of any statistic over units: seeds, runs or measurements),
  `mean_t_interval` (Student's t interval of a mean, for a few seeds) and `mean_t_p` (its
  test's p), `holm` (p-values adjusted over a family of tests), `slope_t_interval`
  (how a paired difference changes with a setting, e.g. the reward noise), `run_correlation`
  (Spearman of a diagnostic against validation success, pooled over runs, resampled by run,
  optionally `centred_on_step`), `verdict`; `matched_top_k` (the Top-k arm's k from Top-p's kept fraction).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

SUCCESS = "rollout/success"
VAL_SUCCESS = "val/success"
MI_ZSCORE = "mi/first_turn/mi_zscore"
RETRIEVAL = "mi/first_turn/retrieval_acc"
REASONING_ENTROPY = "mi/first_turn/reasoning_entropy_est"
KEPT = "filter/kept_ratio"
STEP_SECONDS = "time/step_seconds"
ALARM = "mi/collapse_alarm"
# The MI proxies and the entropies the MI-vs-entropy comparison pits against validation success
# (docs/method.md#the-mi-diagnostics; first turn and random turns of whole trajectories, and the
# action's grounding).
MI_PROXIES = tuple(f"mi/{where}/{name}" for where in ("first_turn", "trajectory") for name in (
    "mi_estimate", "mi_seq_estimate", "mi_zscore", "mi_zscore_seq", "mi_zscore_ema", "retrieval_acc",
    "retrieval_above_chance")) + tuple(f"mi/{where}/{name}" for where in ("action_state", "action_reasoning")
                                       for name in ("mi_estimate", "retrieval_above_chance"))
ENTROPIES = ("mi/first_turn/conditional_entropy_est",  # H(Z | X): the reasoning under its own prompt
             "mi/first_turn/reasoning_entropy_est",  # H(Z): under the other prompts (the marginal)
             "mi/first_turn/reasoning_token_entropy")  # the policy's token entropy over the reasoning


def finite_series(records: Iterable[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for every record where `key` is logged and finite (diagnostics and
    validation are only computed on their schedule)."""
    out = []
    for r in records:
        v = r.get(key)
        if v is not None and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def trained(records: Iterable[dict]) -> list[dict]:
    """The records of steps that trained (step 0 validates the initial policy)."""
    return [r for r in records if r["step"] > 0]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def summarise_run(records: list[dict], last: int = 3) -> dict[str, float]:
    """One run: success is validation success when the run validated (else the rollout's);
    `first_success` is the first measurement (after `train.val_every` updates: the initial
    policy's is the study's start_validation.json), `final_*` the mean over the last `last`
    measurements (one measurement is noisy), `peak_success` the best single one; diagnostics
    are averaged over the run's checkpoints."""
    records = trained(records)
    success = finite_series(records, VAL_SUCCESS) or finite_series(records, SUCCESS)
    values = [v for _, v in success]
    mi = [v for _, v in finite_series(records, MI_ZSCORE)]
    return {
        "first_success": values[0] if values else math.nan,
        "final_success": _mean(values[-last:]),
        "peak_success": max(values) if values else math.nan,
        "final_mi_zscore": _mean(mi[-last:]),
        "mean_mi_zscore": _mean(mi),
        "mean_retrieval_acc": _mean([v for _, v in finite_series(records, RETRIEVAL)]),
        "mean_reasoning_entropy": _mean([v for _, v in finite_series(records, REASONING_ENTROPY)]),
        "mean_kept_ratio": _mean([v for _, v in finite_series(records, KEPT)]),
        "alarm_rate": _mean([v for _, v in finite_series(records, ALARM)]),  # share of checkpoints alarmed
        "mean_step_seconds": _mean([v for _, v in finite_series(records, STEP_SECONDS)][1:]),  # step 1 compiles
        "steps": float(records[-1]["step"]) if records else 0.0,
    }


def _finite_pairs(records: Iterable[dict], x_key: str, y_key: str) -> Iterable[tuple[int, float, float]]:
    """(step, x, y) for every record where both keys are logged and finite."""
    for r in records:
        x, y = r.get(x_key), r.get(y_key)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            yield int(r["step"]), float(x), float(y)


def checkpoint_points(runs: Iterable[list[dict]], x_key: str, y_key: str = SUCCESS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) at every step of every run where both are logged: the diagnostic checkpoints."""
    pairs = [(x, y) for records in runs for _, x, y in _finite_pairs(records, x_key, y_key)]
    return np.asarray([x for x, _ in pairs]), np.asarray([y for _, y in pairs])


def centred_checkpoint_points(seeds: Iterable[list[list[dict]]], x_key: str,
                              y_key: str = SUCCESS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) at the diagnostic checkpoints, each minus its mean over the runs of the same seed at
    the same step. Runs of one seed draw the same levels at each step whatever the arm, so the
    raw points rise and fall together with the batch's levels; centring leaves only what
    differs between arms on the same levels. `seeds`: per seed, its runs (one per arm).
    Checkpoints only one run of the seed reached are left out (nothing to compare with)."""
    centred = [centred_on_step(np.asarray([p for records in runs for p in _finite_pairs(records, x_key, y_key)],
                                          np.float64).reshape(-1, 3)) for runs in seeds]
    points = np.concatenate(centred) if centred else np.zeros((0, 3))
    return points[:, 1], points[:, 2]


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (so tied successes do not invent order)."""
    _, inverse, counts = np.unique(np.asarray(values, np.float64), return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank of each distinct value's last copy
    return ((last - counts + 1 + last) / 2.0)[inverse.reshape(-1)]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: the Pearson correlation of the ranks (NaN when either side is constant
    or there are fewer than 3 points)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 3:
        return math.nan
    rx, ry = ranks(x) - (len(x) + 1) / 2, ranks(y) - (len(y) + 1) / 2
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator > 0 else math.nan


def gradient_buckets(runs: Iterable[list[dict]]) -> list[dict[str, float]]:
    """Per reward-std bucket (0 = lowest std), the mean task and regularisation gradient norms
    and the mean number of groups over every measured step of every run; `measurements` the
    steps measured and `groups_total` the groups they held (the analysis' sample size)."""
    sums: dict[int, dict[str, list[float]]] = {}
    for records in runs:
        for r in records:
            for key, v in r.items():
                if not key.startswith("grad/bucket") or v is None or not math.isfinite(v):
                    continue
                bucket, name = key[len("grad/bucket"):].split("/", 1)
                sums.setdefault(int(bucket), {}).setdefault(name, []).append(float(v))
    table = []
    for bucket in sorted(sums):
        row = {"bucket": float(bucket)}
        row.update({name: float(np.mean(v)) for name, v in sorted(sums[bucket].items())})
        if "groups" in sums[bucket]:
            row["measurements"] = float(len(sums[bucket]["groups"]))
            row["groups_total"] = float(np.sum(sums[bucket]["groups"]))
        if row.get("task_norm") is not None and row.get("reg_norm"):
            row["task_over_reg"] = row["task_norm"] / row["reg_norm"]
        table.append(row)
    return table


def measured_steps(runs: Iterable[list[dict]]) -> list[dict]:
    """The records of every run that hold a gradient analysis."""
    return [r for records in runs for r in records if any(k.startswith("grad/bucket") for k in r)]


def reg_share(steps: Sequence[dict], bucket: int) -> float:
    """The regulariser's share of one bucket's gradient, mean regularisation-gradient norm over
    the sum of the mean regularisation and task norms, over the measured steps where the bucket
    had groups (a bucket without groups logs NaN): 0 when only the task pulls, 1 when only the
    regulariser does (GRPO's groups without reward variance have no task gradient at all), above
    0.5 when the regulariser outweighs the task. A share, not a ratio, so that a zero task norm
    still has a value and an interval."""
    prefix = f"grad/bucket{bucket}/"
    norms = [(r[prefix + "task_norm"], r[prefix + "reg_norm"]) for r in steps
             if math.isfinite(r.get(prefix + "task_norm", math.nan)) and math.isfinite(r.get(prefix + "reg_norm", math.nan))]
    if not norms:
        return math.nan
    task, reg = float(np.mean([t for t, _ in norms])), float(np.mean([g for _, g in norms]))
    return reg / (reg + task) if reg + task > 0 else math.nan


# ----------------------------------------------------------------------------- the claims


def final_validation(records: list[dict], last: int = 3) -> float:
    """A run's validation success at its end: the mean of its last `last` validations (on the
    fixed levels; NaN when it never validated)."""
    values = [v for _, v in finite_series(trained(records), VAL_SUCCESS)]
    return _mean(values[-last:])


def paired_differences(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], np.ndarray]:
    """Per seed, arm A's value minus arm B's, over the seeds both arms have (finite in both):
    runs of one seed share their initial rollouts' randomness and validation levels."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    return seeds, np.asarray([a[s] - b[s] for s in seeds], np.float64)


def mid_minus_ends(per_rate: dict[float, dict[int, float]], low: float, high: float) -> tuple[list[int], np.ndarray]:
    """"Helps most mid-range" as one paired contrast: per seed present at every rate, the mean
    difference over the rates in [low, high] minus the mean over the others. Per seed, so the
    seed's shared randomness cancels as in a paired difference; empty when a side has no rate."""
    mid = [q for q in per_rate if low <= q <= high]
    ends = [q for q in per_rate if not low <= q <= high]
    if not mid or not ends:
        return [], np.zeros(0)
    seeds = sorted(set.intersection(*(set(d) for d in per_rate.values())))
    return seeds, np.asarray([np.mean([per_rate[q][s] for q in mid]) - np.mean([per_rate[q][s] for q in ends])
                              for s in seeds], np.float64)


def bootstrap_interval(units: Sequence, statistic, resamples: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float, float]:
    """(statistic of the units, low, high): the percentile bootstrap interval at `level` —
    `resamples` times, as many units drawn with replacement (numpy's Generator from `seed`,
    all draws at once: `integers(0, n, size=(resamples, n))`) and the statistic recomputed;
    resamples where it is not finite (e.g. a constant resample's correlation) are left out.
    NaNs when there are no units; with one unit the statistic and no interval (every resample is
    that unit again, an interval of zero width that says nothing)."""
    n = len(units)
    if n == 0:
        return math.nan, math.nan, math.nan
    estimate = float(statistic(list(units)))
    if n == 1:
        return estimate, math.nan, math.nan
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.asarray([statistic([units[i] for i in row]) for row in draws], np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return estimate, math.nan, math.nan
    low, high = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return estimate, float(low), float(high)


def mean_difference_interval(differences: Sequence[float], resamples: int = 10000,
                             seed: int = 0) -> tuple[float, float, float]:
    """Mean of paired differences with its bootstrap 95% interval over the seeds."""
    return bootstrap_interval(list(differences), lambda d: float(np.mean(d)), resamples, seed)


def mean_t_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences with Student's t interval at `level` (mean ± t · sd / √n,
    sd with n − 1): with 3–5 seeds the percentile bootstrap's interval is too narrow (with 3 it
    is the range of the differences), the t interval is the usual small-sample one. NaN bounds
    below 2 differences."""
    from scipy import stats  # a jax dependency; imported here so the module loads with numpy alone

    values = np.asarray(differences, np.float64)
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def mean_t_p(differences: Sequence[float]) -> float:
    """Two-sided p of Student's t test that the mean of paired differences is 0 (t = mean /
    (sd / √n), n − 1 degrees of freedom); NaN below 2 differences or with no spread."""
    from scipy import stats

    values = np.asarray(differences, np.float64)
    if len(values) < 2 or float(values.std(ddof=1)) == 0.0:
        return math.nan
    t = float(values.mean()) / (float(values.std(ddof=1)) / math.sqrt(len(values)))
    return float(2 * stats.t.sf(abs(t), len(values) - 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family, in the order given: the k-th smallest p
    times (m − k + 1), never below an earlier one's, at most 1. A test is significant at level α
    after the correction when its adjusted p < α."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def slope_t_interval(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Least-squares slope of y on x with Student's t interval at `level`: slope ± t(n − 2) · se,
    se = √(Σ residual² / (n − 2) / Σ (x − x̄)²). Does a paired difference change with a setting
    (the filter's gain with the reward noise, one point per seed and setting)? NaNs without two
    distinct x; NaN bounds below 3 points."""
    from scipy import stats

    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(np.unique(xs)) < 2:
        return math.nan, math.nan, math.nan
    spread = float(((xs - xs.mean()) ** 2).sum())
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum()) / spread
    if len(xs) < 3:
        return slope, math.nan, math.nan
    residuals = ys - ys.mean() - slope * (xs - xs.mean())
    se = math.sqrt(float((residuals ** 2).sum()) / (len(xs) - 2) / spread)
    half = float(stats.t.ppf(0.5 + level / 2, len(xs) - 2)) * se
    return slope, slope - half, slope + half


def validation_points(records: list[dict], keys: Sequence[str]) -> np.ndarray:
    """[points, len(keys) + 2]: the step (first column), the diagnostics `keys` and validation
    success (last column) at the steps of one run where all of them were logged."""
    rows = [[float(r["step"]), *(float(r[k]) for k in (*keys, VAL_SUCCESS))] for r in records
            if all(math.isfinite(r.get(k, math.nan)) for k in (*keys, VAL_SUCCESS))]
    return np.asarray(rows, np.float64).reshape(-1, len(keys) + 2)


def centred_on_step(points: np.ndarray) -> np.ndarray:
    """`points` (rows of step, values...) with each value minus its mean over the rows of the same
    step; steps only one row has are left out. Runs that all improve with training make a pooled
    correlation measure how far they have trained; centring leaves what differs between runs."""
    steps, inverse, counts = np.unique(points[:, 0], return_inverse=True, return_counts=True)
    sums = np.zeros((len(steps), points.shape[1] - 1))
    np.add.at(sums, inverse, points[:, 1:])
    centred = points.copy()
    centred[:, 1:] -= (sums / counts[:, None])[inverse]
    return centred[counts[inverse] > 1]


def run_correlation(runs: Sequence[list[dict]], key: str, against: str | None = None, resamples: int = 2000,
                    seed: int = 0, centre: bool = False) -> tuple[float, float, float, int, int]:
    """Spearman of `key` against validation success over the points of all runs pooled, with a
    bootstrap 95% interval that resamples whole runs (a run's points are not independent).
    With `against`: |Spearman(key)| − |Spearman(against)| on the points where both are logged,
    the two on the same resamples (does `key` predict success better?). `centre`: both sides
    centred on the step over the runs pooled (in each resample: `centred_on_step`). Also the
    number of points and of runs that have any; runs without points are left out."""
    keys = (key,) if against is None else (key, against)
    per_run = [p for p in (validation_points(r, keys) for r in runs) if len(p)]

    def pooled(chosen):
        points = np.concatenate(chosen)
        if centre:
            points = centred_on_step(points)
        rho = spearman(points[:, 1], points[:, -1])
        return rho if against is None else abs(rho) - abs(spearman(points[:, 2], points[:, -1]))

    if not per_run:
        return math.nan, math.nan, math.nan, 0, 0
    value, low, high = bootstrap_interval(per_run, pooled, resamples, seed)
    return value, low, high, sum(len(p) for p in per_run), len(per_run)


def verdict(low: float, high: float, above: str = "A > B", below: str = "A < B") -> str:
    """What a 95% interval of a difference (or a correlation) says: `above` when it lies above
    0, `below` when below, otherwise that the data cannot tell; without an interval (no data,
    or one seed or run) none."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval (fewer than 2 seeds or runs)"
    if low > 0:
        return above
    if high < 0:
        return below
    return "not shown (the interval spans 0)"


def matched_top_k(kept_ratios: Sequence[float], num_groups: int) -> int:
    """The Top-k arm's group count matched to Top-p: the mean kept fraction of the finished
    Top-p runs (each run's mean over its steps) times the groups, rounded, at least 1."""
    if not len(kept_ratios):
        raise ValueError("matched_top_k needs the kept fractions of at least one finished Top-p run")
    return max(1, int(round(float(np.mean(kept_ratios)) * num_groups)))
