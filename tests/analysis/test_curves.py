"""`python -m ragen_jax.plot`: curves from metrics.jsonl, absent metrics, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ragen_jax.analysis import curves
from ragen_jax.envs.frozenlake import FROZENLAKE
from ragen_jax.envs.sokoban import SOKOBAN
from ragen_jax.cli import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_metrics(workdir, records):
    with open(workdir / "metrics.jsonl", "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def synthetic(steps=12):
    """Train lines every step (MI every 5 steps, NaN otherwise), validation lines every 4."""
    out = []
    for s in range(1, steps + 1):
        r = {"step": s, "rollout/success": s / steps, "rollout/response_length": 50.0 - s, "filter/kept_ratio": 0.5,
             "actor/loss": 0.1 * s}
        mi = s == 1 or s % 5 == 0
        for name, value in (("retrieval_acc", 0.9 - s / 100), ("retrieval_chance", 0.125), ("mi_zscore", 2.0),
                            ("mi_zscore_ema", 1.5), ("reasoning_token_entropy", 1.2)):
            r[f"mi/first_turn/{name}"] = value if mi else float("nan")
        out.append(r)
        if s % 4 == 0:
            out.append({"step": s, "val/success": s / 20, "val/pass@k": s / 15,
                        "val/reasoning/player_right": 0.9 - s / 50})
    return out


def check_png(path):
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert float(np.asarray(image[..., :3]).std()) > 0  # not a blank canvas


def test_writes_a_png_of_the_curves(tmp_path, capsys):
    write_metrics(tmp_path, synthetic())
    assert plot.main(["--workdir", str(tmp_path)]) == 0
    out = tmp_path / "training_curves.png"
    check_png(out)
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "training_curves.png"]  # no temporary left


def test_every_panel_draws_its_logged_metrics(tmp_path):
    write_metrics(tmp_path, synthetic())
    drawn = curves.plot_curves(curves.read_metrics(tmp_path / "metrics.jsonl"), tmp_path / "c.png")
    assert drawn == {
        "Success rate": ["rollout/success", "val/success"],
        "Retrieval accuracy (first turn)": ["mi/first_turn/retrieval_acc", "mi/first_turn/retrieval_chance"],
        "MI-ZScore (first turn)": ["mi/first_turn/mi_zscore_ema", "mi/first_turn/mi_zscore"],
        "Reasoning entropy (first turn)": ["mi/first_turn/reasoning_token_entropy"],
        "Kept ratio (SNR filter)": ["filter/kept_ratio"],
        "Response length": ["rollout/response_length"],
        "Reasoning names the player cell (validation)": ["val/reasoning/player_right"],
    }


def test_step_0_validation_the_player_cell_and_the_alarm_are_drawn(tmp_path):
    """A run that validated its initial policy (step 0), checks its reasoning's player cell
    and raised the collapse alarm at steps 5 and 10."""
    records = [{"step": 0, "val/success": 0.1, "val/reasoning/player_right": 0.95,
                "val/reasoning/player_top_share": 0.2}]
    for r in synthetic():
        if r["step"] % 5 == 0 and "mi/first_turn/mi_zscore" in r:
            r["mi/collapse_alarm"] = 1.0
        elif "mi/first_turn/mi_zscore" in r:
            r["mi/collapse_alarm"] = float("nan") if r["step"] % 5 else 0.0
        if "val/success" in r:
            r.update({"val/reasoning/player_right": 0.5, "val/reasoning/player_top_share": 0.6})
        records.append(r)
    write_metrics(tmp_path, records)
    series = curves.read_metrics(tmp_path / "metrics.jsonl")
    fig, drawn = curves.figure(series)
    assert drawn["Reasoning names the player cell (validation)"] == [
        "val/reasoning/player_right", "val/reasoning/player_top_share", curves.ALARM]
    assert all(names[-1] == curves.ALARM for names in drawn.values() if names)
    panels = {ax.get_title(): ax for ax in fig.axes}
    success = panels["Success rate"]
    vertical = sorted(line.get_xdata()[0] for line in success.lines if len(set(line.get_xdata())) == 1)
    assert vertical == [5, 10]  # the alarm's steps (step 1's alarm is 0)
    validation = next(line for line in success.lines if "(val/success)" in line.get_label()
                      and "step 0" not in line.get_label())
    assert list(validation.get_xdata()) == [0, 4, 8, 12]
    (start,) = [line for line in success.lines if line.get_label().endswith("at step 0")]
    assert list(start.get_ydata()) == [0.1, 0.1]  # the initial policy's level across the run
    assert curves.plot_curves(series, tmp_path / "c.png") == drawn
    check_png(tmp_path / "c.png")


def test_read_metrics_keeps_finite_points_and_merges_steps(tmp_path):
    write_metrics(tmp_path, [
        '{"step": 1, "a": 1.0, "b": NaN, "c": Infinity, "note": "text", "flag": true}',
        '{"step": 2, "a": 2.0}',
        "",
        '{"step": 1, "a": 1.5, "val/success": 0.25}',  # the same step again (a resumed run): later wins
        '{"step": 3, "a": null, "b": 4, "huge": 1' + "0" * 400 + "}",  # beyond float range
    ])
    series = curves.read_metrics(tmp_path / "metrics.jsonl")
    assert series["a"] == ([1, 2], [1.5, 2.0])
    assert series["b"] == ([3], [4.0])
    assert series["c"] == ([], []) and series["huge"] == ([], [])
    assert series["val/success"] == ([1], [0.25])
    assert "note" not in series and "flag" not in series and "step" not in series


def test_absent_metrics_are_not_logged_panels(tmp_path, capsys):
    """Only a success curve (no MI, no filter, no validation): the other panels say so."""
    write_metrics(tmp_path, [{"step": s, "rollout/success": 0.1 * s, "mi/first_turn/mi_zscore": float("nan")}
                             for s in range(1, 4)])
    drawn = curves.plot_curves(curves.read_metrics(tmp_path / "metrics.jsonl"), tmp_path / "c.png")
    assert drawn["Success rate"] == ["rollout/success"]
    assert all(not v for k, v in drawn.items() if k != "Success rate")
    check_png(tmp_path / "c.png")
    assert plot.main(["--workdir", str(tmp_path), "--out", str(tmp_path / "sub.png")]) == 0
    check_png(tmp_path / "sub.png")
    assert "not logged: Retrieval accuracy" in capsys.readouterr().out
    # A single point per metric plots too.
    write_metrics(tmp_path, [{"step": 7, "val/success": 1.0}])
    assert plot.main(["--workdir", str(tmp_path)]) == 0
    check_png(tmp_path / "training_curves.png")


def test_missing_workdir_from_the_command_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ragen_jax.plot", "--workdir", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0] and "does not exist" in lines[0], result.stderr
    assert not (tmp_path / "nope").exists()


BAD_FILES = [
    (None, "no such file"),
    ([], "empty"),
    (["", "   "], "empty"),
    ([{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, '{"step": 3, "a": '], "metrics.jsonl:3: malformed line, not JSON"),
    ([{"step": 1}, "[1, 2]"], "metrics.jsonl:2: malformed line, expected a JSON object"),
    (['{"a": 1.0}'], "metrics.jsonl:1: malformed line, \"step\""),
    (['{"step": "4", "a": 1.0}'], "metrics.jsonl:1: malformed line, \"step\""),
    (['{"step": 1.5}'], "metrics.jsonl:1: malformed line, \"step\""),
    (['{"step": NaN}'], "metrics.jsonl:1: malformed line, \"step\""),
]


@pytest.mark.parametrize("content, message", BAD_FILES)
def test_bad_metrics_files_end_with_one_line_and_write_nothing(tmp_path, capsys, content, message):
    if content is not None:
        write_metrics(tmp_path, content)
    old = PNG_SIGNATURE + b"an earlier plot"
    (tmp_path / "training_curves.png").write_bytes(old)
    before = sorted(os.listdir(tmp_path))
    assert plot.main(["--workdir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert lines[0].startswith("ragen_jax.plot: error: ")
    assert captured.out == ""
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "training_curves.png").read_bytes() == old  # an earlier plot is untouched


@pytest.mark.parametrize("argv, message", [
    ([], "--workdir"),
    (["--workdir"], "--workdir"),
    (["--workdir", "{tmp}", "--bogus"], "unrecognized arguments: --bogus"),
    (["--workdir", "{tmp}/metrics.jsonl"], "not a directory"),
    (["--workdir", "{tmp}", "--out", "{tmp}/missing/c.png"], "missing does not exist"),
    (["--workdir", "{tmp}", "--out", "{tmp}"], "is a directory"),
])
def test_bad_arguments_end_with_one_line(tmp_path, capsys, argv, message):
    write_metrics(tmp_path, synthetic(3))
    assert plot.main([a.format(tmp=tmp_path) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


def test_unwritable_output_is_one_line(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    write_metrics(tmp_path, synthetic(3))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert plot.main(["--workdir", str(tmp_path), "--out", str(locked / "c.png")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "cannot write" in lines[0]
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def test_panel_metric_names_are_the_ones_logged():
    """Guards against renames: training names from the train step, the filter and the
    diagnostics; `val/` names from the validation metrics."""
    package = os.path.dirname(os.path.dirname(curves.__file__))
    read = lambda module: open(os.path.join(package, f"{module}.py")).read()
    names = [name for _, _, _, curves in curves.PANELS for name, _, _ in curves]
    for name in names:
        if name == "mi/first_turn/reasoning_entropy_est":
            continue  # an estimator not computed yet; plotted when logged
        if name.startswith("mi/first_turn/"):
            assert '"mi/first_turn/' in read("diagnostics/diagnose")
            leaf = name.rsplit("/", 1)[1]
            assert f'"{leaf}"' in read("diagnostics/mi") + read("diagnostics/diagnose"), name
        elif name.startswith("val/reasoning/"):
            leaf = name.rsplit("/", 1)[1]
            fact, share = leaf.split("_", 1)  # "holes_right": a fact the games grade and its share
            graded = fact in ("player", SOKOBAN.blocked_kind, FROZENLAKE.blocked_kind)
            assert (graded and share in ("right", "stated", "top_share")) or f'"{leaf}"' in read(
                "diagnostics/reasoning_check"), name
        elif name.startswith("val/"):
            # ragen_jax.training.validation reports rollout_metrics without their "rollout/" prefix
            assert f'"rollout/{name[4:]}"' in read("training/step"), name
        else:
            assert f'"{name}"' in read("training/step") + read("rl/filtering"), name
