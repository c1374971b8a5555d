"""Statistics over finished training runs, for the reproduction study (benchmarks/reproduce.py).

Everything here reads `metrics.jsonl` records (one dict per logged step, as `train` writes
them) and returns plain numbers, so the study's tables can be recomputed from the logs alone:

- `summarise_run`: one run's row of the results table (final / peak success, MI-ZScore,
  retrieval accuracy, reasoning entropy, collapse alarms, kept ratio, step time);
- `checkpoint_points` + `spearman`: the paper's "MI-ZScore vs success" and "reasoning entropy vs
  success" rank correlations across runs and diagnostic checkpoints; `centred_checkpoint_points`
  the same with each checkpoint centred on the runs that saw the same levels;
- `gradient_buckets`: task- and regularisation-gradient norms by reward-std bucket.
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


def finite_series(records: Iterable[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for every record where `key` is logged and finite (diagnostics and
    validation are only computed on their schedule)."""
    out = []
    for r in records:
        v = r.get(key)
        if v is not None and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def summarise_run(records: list[dict], last: int = 3) -> dict[str, float]:
    """One run: success is validation success when the run validated (else the rollout's);
    `first_success` is the first measurement (after `train.val_every` updates: the initial
    policy's is the study's start_validation.json), `final_*` the mean over the last `last`
    measurements (one measurement is noisy), `peak_success` the best single one; diagnostics
    are averaged over the run's checkpoints."""
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
    xs, ys = [], []
    for runs in seeds:
        at_step: dict[int, list[tuple[float, float]]] = {}
        for records in runs:
            for step, x, y in _finite_pairs(records, x_key, y_key):
                at_step.setdefault(step, []).append((x, y))
        for points in at_step.values():
            if len(points) < 2:
                continue
            mx, my = np.mean(points, axis=0)
            xs += [x - mx for x, _ in points]
            ys += [y - my for _, y in points]
    return np.asarray(xs), np.asarray(ys)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (so tied successes do not invent order)."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    out = np.empty(len(values), np.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        out[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return out


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
    and the mean number of groups over every measured step of every run."""
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
        if row.get("task_norm") is not None and row.get("reg_norm"):
            row["task_over_reg"] = row["task_norm"] / row["reg_norm"]
        table.append(row)
    return table
