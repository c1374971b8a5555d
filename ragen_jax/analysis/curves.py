"""Training curves of a run (drawn by `python -m ragen_jax.plot --workdir DIR [--out PNG]`).

Reads `DIR/metrics.jsonl` (one JSON object per line, `{"step": int, <metric>: float, ...}`;
validation lines carry `val/` keys) and writes `DIR/training_curves.png`: a grid of panels like
the paper's training-dynamics figures — success (rollout and validation), first-turn retrieval
accuracy against chance, MI-ZScore (EMA and raw), reasoning entropy, the filter's kept ratio,
the response length, and whether the reasoning names the board's player cell (validation, for
the built-in tasks' reasoning template). Validation drawn from step 0 (the initial policy) has
a dotted line at that level; a dashed red line marks each step where the collapse alarm fired.

Lines logged for the same step are merged (a later value replaces an earlier one: a resumed run
may log a step twice). Only finite values are drawn: MI metrics are computed every few steps
and are NaN or missing in between. A panel whose metrics were never logged says so.

Bad input (no workdir, no or empty metrics file, a malformed line) ends with one line on stderr
and exit code 2, and nothing is written; the PNG is written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from ragen_jax.core.files import usual_mode  # no jax: plotting stays light

METRICS_FILE = "metrics.jsonl"
DEFAULT_OUT = "training_curves.png"

# (title, y label, y limits or None, [(metric, label, style)]); style: "line", "dashed",
# "faint" or "points"
FRACTION = (-0.03, 1.03)
PANELS: tuple = (
    ("Success rate", "success", FRACTION, (
        ("rollout/success", "train rollout", "line"),
        ("val/success", "validation", "points"),
    )),
    ("Retrieval accuracy (first turn)", "accuracy", FRACTION, (
        ("mi/first_turn/retrieval_acc", "retrieval acc", "line"),
        ("mi/first_turn/retrieval_chance", "chance", "dashed"),
    )),
    ("MI-ZScore (first turn)", "z-score", None, (
        ("mi/first_turn/mi_zscore_ema", "EMA", "line"),
        ("mi/first_turn/mi_zscore", "raw", "faint"),
    )),
    ("Reasoning entropy (first turn)", "nats / token", None, (
        ("mi/first_turn/reasoning_entropy_est", "estimate", "line"),
        ("mi/first_turn/reasoning_token_entropy", "token entropy", "line"),
    )),
    ("Kept ratio (SNR filter)", "fraction of groups", FRACTION, (
        ("filter/kept_ratio", "kept ratio", "line"),
    )),
    ("Response length", "tokens / turn", None, (
        ("rollout/response_length", "train rollout", "line"),
        ("val/response_length", "validation", "points"),
    )),
    ("Reasoning names the player cell (validation)", "share of stated cells", FRACTION, (
        ("val/reasoning/player_right", "right", "points"),
        ("val/reasoning/player_top_share", "most named cell", "faint"),
        ("val/reasoning/holes_right", "holes next to it right", "points"),
        ("val/reasoning/walls_right", "walls next to it right", "points"),
    )),
)
ALARM = "mi/collapse_alarm"


class PlotError(Exception):
    """Bad input, reported as one line (no traceback)."""


Series = dict[str, tuple[list[int], list[float]]]


def read_metrics(path: str | os.PathLike) -> Series:
    """metric -> (steps, values), finite values only, sorted by step; lines of the same step
    merged (later lines win). Raises PlotError naming the file (and line) on bad input."""
    path = Path(path)
    if not path.is_file():
        raise PlotError(f"{path}: no such file (is this a training workdir?)")
    by_step: dict[int, dict[str, float]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                record = _parse_line(line, path, number)
                by_step.setdefault(record.pop("step"), {}).update(record)
    except (OSError, UnicodeDecodeError) as e:
        raise PlotError(f"{path}: cannot read: {e}") from None
    if not by_step:
        raise PlotError(f"{path}: no metrics logged (the file is empty)")
    series: Series = {}
    for step in sorted(by_step):
        for name, value in by_step[step].items():
            if value is not None and math.isfinite(value):
                steps, values = series.setdefault(name, ([], []))
                steps.append(step)
                values.append(value)
    # metrics logged only as NaN: present, with no points
    for record in by_step.values():
        for name in record:
            series.setdefault(name, ([], []))
    return series


def _parse_line(line: str, path: Path, number: int) -> dict:
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except ValueError as e:
        raise PlotError(f"{where}: malformed line, not JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise PlotError(f"{where}: malformed line, expected a JSON object, got {type(record).__name__}")
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) \
            or step != int(step) or step < 0:
        raise PlotError(f"{where}: malformed line, \"step\" must be a non-negative integer, got {step!r}")
    out = {"step": int(step)}
    for name, value in record.items():
        if name == "step":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            continue  # not a number (e.g. a note or a timestamp string): not a curve
        try:
            out[name] = None if value is None else float(value)
        except OverflowError:  # an integer beyond float range: not a plottable point
            out[name] = math.inf
    return out


def plot_curves(series: Series, out: str | os.PathLike, title: str | None = None) -> dict[str, list[str]]:
    """Draw the panels of `series` (from `read_metrics`) into the PNG `out`, atomically
    (written under a temporary name in the same directory, then renamed). Returns each
    panel's title -> the metrics drawn in it (empty: the panel says "not logged"; the alarm's
    name where its markers are drawn)."""
    fig, drawn_in = figure(series, title)
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        usual_mode(Path(tmp))  # mkstemp's 0600 -> what a plain open() would give
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return drawn_in


def figure(series: Series, title: str | None = None):
    """(matplotlib Figure, each panel's title -> the metrics drawn in it) of `series`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    alarms = [step for step, value in zip(*series.get(ALARM, ([], []))) if value >= 1]
    columns = 3
    rows = math.ceil(len(PANELS) / columns)
    fig = Figure(figsize=(5.0 * columns, 3.6 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    drawn_in: dict[str, list[str]] = {}
    for ax, (panel_title, ylabel, limits, curves) in zip(axes, PANELS):
        ax.set_title(panel_title, fontsize=11)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        drawn, empty = drawn_in.setdefault(panel_title, []), []
        for name, label, style in curves:
            if name not in series:
                continue
            steps, values = series[name]
            if not steps:
                empty.append(name)
                continue
            _draw(ax, steps, values, f"{label} ({name})", style)
            drawn.append(name)
        if drawn and alarms:
            for i, step in enumerate(alarms):
                ax.axvline(step, color="tab:red", linestyle="--", linewidth=0.9, alpha=0.6,
                           label=f"collapse alarm ({ALARM})" if i == 0 else None)
            drawn.append(ALARM)
        if drawn:
            ax.legend(fontsize=7, loc="best")
            if limits is not None:
                ax.set_ylim(*limits)
        else:
            names = "\n".join(name for name, _, _ in curves)
            note = "no finite values" if empty else "not logged"
            ax.text(0.5, 0.5, f"{note}\n\n{names}", ha="center", va="center", fontsize=8, color="0.4",
                    transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
    for ax in axes[len(PANELS):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=12)
    return fig, drawn_in


def _draw(ax, steps, values, label, style):
    if style == "dashed":
        ax.plot(steps, values, "--", color="0.35", linewidth=1.2, label=label)
    elif style == "faint":
        ax.plot(steps, values, "-", alpha=0.35, linewidth=1.0, marker="." if len(steps) < 60 else None, label=label)
    elif style == "points":
        (line,) = ax.plot(steps, values, "-", marker="o", markersize=3.5, linewidth=1.0, label=label)
        if steps[0] == 0:  # validated before training: the level it started from
            ax.axhline(values[0], color=line.get_color(), linestyle=":", linewidth=1.0, label=f"{label} at step 0")
    else:
        ax.plot(steps, values, "-", marker="." if len(steps) < 60 else None, linewidth=1.5, label=label)
