"""benchmarks/exploration.py's group statistics against a plain loop, and its bad flags."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import exploration  # noqa: E402


def test_group_spread_against_a_python_loop():
    rng = np.random.default_rng(0)
    for group_size in (2, 4):
        success = rng.random(8 * group_size) < 0.5
        moves = rng.integers(0, 3, size=(8 * group_size, 2))
        got = exploration.group_spread(success, moves, group_size)
        first = turn = varies = 0
        for g in range(8):
            rows = range(g * group_size, (g + 1) * group_size)
            first += any(moves[r, 0] != moves[rows[0], 0] for r in rows)
            turn += any(list(moves[r]) != list(moves[rows[0]]) for r in rows)
            varies += any(success[r] != success[rows[0]] for r in rows)
        assert got == {"first move differs": first / 8, "first-turn moves differ": turn / 8, "success varies": varies / 8}


@pytest.mark.parametrize("flag", ["--groups", "--keys"])
def test_bad_counts_give_one_line(flag):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "exploration.py"), "--env", "frozenlake", flag, "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == f"exploration.py: error: {flag}=0 must be >= 1"


@pytest.mark.parametrize("args, line", [
    (["--set", "rollout.nope=1"], "error: unknown config key 'rollout.nope'"),
    (["--set", "rollout.temperature"], "exploration.py: error: --set 'rollout.temperature': expected KEY=VALUE"),
])
def test_bad_overrides_give_one_line(args, line):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "exploration.py"), "--env", "frozenlake", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(line), run.stderr[-500:]
