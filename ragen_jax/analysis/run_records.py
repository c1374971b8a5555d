"""What the study reads from its run directories, and how it writes the files they share.

A run is an ordinary `train` run in `<out>/<env>/<arm>/seed<k>` (or `learn`'s `<env>/seed<k>`):
`config.json` holds its length, `metrics.jsonl` one record per logged step. A run has finished
once it logged its config's last step; only finished runs count in the report and in Top-k's
matching. Runs of a parallel study read each other's files while they are written, so a line
still being written is skipped and shared files are replaced whole (`write_whole`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def last_step(workdir: Path) -> int:
    """The last step the run in `workdir` logged, -1 if none (a line still being written, by a
    run of a parallel study, does not count)."""
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    try:
        return json.loads(lines[-1])["step"] if lines else -1
    except json.JSONDecodeError:
        return json.loads(lines[-2])["step"] if len(lines) > 1 else -1


def finished(workdir: Path, steps: int) -> bool:
    """Whether the run in `workdir` logged step `steps`."""
    return last_step(workdir) >= steps


def run_finished(workdir: Path) -> bool:
    """Whether the run in `workdir` logged its config's last step (no config: not started)."""
    config = workdir / "config.json"
    return config.exists() and finished(workdir, json.loads(config.read_text())["train"]["steps"])


def records(workdir: Path) -> list[dict]:
    """Every record the run in `workdir` logged, in order."""
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def finished_runs(arm_dir: Path) -> list[list[dict]]:
    """The records of every finished run of an arm (its `seed<k>` directories)."""
    return [records(workdir) for workdir in sorted(arm_dir.glob("seed*")) if run_finished(workdir)]


def load_runs(out: Path) -> dict[tuple[str, str], dict[int, list[dict]]]:
    """{(env, arm): {seed: records}} of every finished run under `out` (a study's
    `<env>/<arm>/seed<k>` or learn's `<env>/seed<k>`, arm "default"); unfinished runs are left out."""
    runs: dict[tuple[str, str], dict[int, list[dict]]] = {}
    for metrics in sorted(out.glob("*/*/seed*/metrics.jsonl")) + sorted(out.glob("*/seed*/metrics.jsonl")):
        workdir = metrics.parent
        parts = workdir.relative_to(out).parts
        if not run_finished(workdir):
            continue
        env, arm = parts[0], (parts[1] if len(parts) == 3 else "default")
        runs.setdefault((env, arm), {})[int(parts[-1][len("seed"):])] = records(workdir)
    return runs


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file of this process, so a parallel reader sees all
    of it or none, and two writers never share the temporary file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)
