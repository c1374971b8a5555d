"""The study's statistics against independent references (scipy, hand-written records), and a
one-seed, two-step smoke run of benchmarks/reproduce.py (study + report)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs
from scipy import stats

from ragen_jax import study

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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    def run(val, train):
        return [{"step": s, study.SUCCESS: t, **({study.VAL_SUCCESS: val[s]} if s in val else {})}
                for s, t in zip(range(1, len(train) + 1), train)]

    arms = {"top_p-grpo": [run({3: 0.4, 6: 0.6}, [0, 0, 0, 0, 1, 1]), run({3: 0.2, 6: 0.4}, [1, 1, 1, 1, 1, 1])]}
    lines = reproduce.figure_lines(arms, start=0.25)
    steps, values = lines[study.VAL_SUCCESS]["top_p-grpo"]
    assert steps == [0, 3, 6] and np.allclose(values, [0.25, 0.3, 0.5])
    steps, values = lines[study.SUCCESS]["top_p-grpo"]  # per-step means 0.5 0.5 0.5 0.5 1 1
    assert steps == [5, 6] and np.allclose(values, [0.6, 0.7])
    assert lines[study.MI_ZSCORE]["top_p-grpo"] == ([], [])
    steps, _ = reproduce.figure_lines(arms)[study.VAL_SUCCESS]["top_p-grpo"]
    assert steps == [3, 6]  # no start point when the initial policy's validation is unknown


TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens=8",
        "algo.mini_batch_size=4", "diagnostics.num_samples=4", "diagnostics.per_turn_samples=2",
        "diagnostics.compute_freq=1", "mesh.data=1"]


def test_reproduce_study_smoke(tmp_path):
    """One seed, two steps, one arm (each arm is a fresh compile; `study`'s loop over arms is
    plain Python): the run lands where `report` finds it, and the report has its row, the
    correlations and the gradient-bucket table, and a figure."""
    script = str(ROOT / "benchmarks" / "reproduce.py")
    sets = [a for kv in TINY for a in ("--set", kv)]
    run = subprocess.run([sys.executable, script, "study", "--env", "sokoban", "--seeds", "0", "--steps", "2",
                          "--filters", "top_p", "--algos", "grpo", "--val-every", "2", "--eval-episodes", "2",
                          "--grad-buckets", "2", "--out", str(tmp_path), *sets],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "sokoban" / "top_p-grpo" / "seed0" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2]
    saved = json.loads((tmp_path / "sokoban" / "top_p-grpo" / "seed0" / "config.json").read_text())
    assert saved["train"]["save_every"] == 10  # a restart repeats at most 10 steps of a 40-step arm
    start = json.loads((tmp_path / "sokoban" / "start_validation.json").read_text())
    assert 0.0 <= start["success"] <= 1.0
    out = subprocess.run([sys.executable, script, "report", "--out", str(tmp_path), "--figures", str(tmp_path / "fig")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| sokoban | top_p-grpo | 1 |" in out.stdout
    assert "| sokoban (initial policy of every arm) |" in out.stdout
    assert "Spearman(MI-ZScore, success)" in out.stdout and "| 1 |" in out.stdout  # a gradient bucket row
    assert (tmp_path / "fig" / "study_sokoban.png").stat().st_size > 0


@pytest.mark.parametrize("script, args, line", [
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--eval-samples", "0"],
     "reproduce.py: error: --eval-samples=0 must be >= 1"),
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--eval-episodes", "0"],
     "reproduce.py: error: --eval-episodes=0 must be >= 1"),
    ("reproduce.py", ["learn", "--env", "sokoban", "--out", "unused", "--set", "rollout.num_groups"],
     "reproduce.py: error: --set 'rollout.num_groups': expected KEY=VALUE"),
    ("sft_fit_speed.py", ["--set", "rollout.max_turns"],
     "sft_fit_speed.py: error: --set 'rollout.max_turns': expected KEY=VALUE"),
    ("step_time.py", ["--steps", "0"], "step_time.py: error: --steps=0 must be >= 1"),
    ("step_time.py", ["--set", "algo.micro_batch_size"],
     "step_time.py: error: --set 'algo.micro_batch_size': expected KEY=VALUE"),
])
def test_benchmark_scripts_reject_bad_arguments_in_one_line(script, args, line):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == line, run.stderr[-500:]
