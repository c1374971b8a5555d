"""Run command-line jobs as subprocesses, a few at a time, each after the jobs it waits for.

The study's runs are independent programs but for a few orderings (Top-k is matched to the
finished Top-p runs; an env's runs read the initial policy's validation its first run writes; a
run starts without compiling once the first run of its arm has filled the compilation cache),
so `reproduce.py study --jobs N` hands them to this pool: N processes share the host's cores or
one accelerator. A job whose prerequisite failed is not started; the others go on.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping


@dataclass
class Job:
    name: str  # unique; what `after` refers to
    argv: list[str]  # the command
    log: Path  # its stdout and stderr
    after: tuple[str, ...] = ()  # jobs that must have succeeded first
    # a further condition to start, given the exit codes of the jobs ended so far (checked while waiting)
    ready: Callable[[Mapping[str, int]], bool] = lambda ended: True
    before: Callable[[], None] = lambda: None  # runs in this process just before the job starts
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment


def run_jobs(jobs: list[Job], workers: int, poll_seconds: float = 1.0, say=print) -> dict[str, int]:
    """Run `jobs`, at most `workers` at once, each in list order as soon as its prerequisites
    succeeded and `ready(ended jobs' codes)` holds. Returns {name: exit code}; a job never started because a
    prerequisite failed gets -1. `say` gets one line per start and end."""
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be unique")
    unknown = {a for job in jobs for a in job.after} - set(names)
    if unknown:
        raise ValueError(f"jobs wait for unknown jobs: {sorted(unknown)}")
    waiting = list(jobs)
    running: dict[str, tuple[subprocess.Popen, float, object]] = {}
    codes: dict[str, int] = {}
    start = time.monotonic()
    while waiting or running:
        for name, (process, began, log) in list(running.items()):
            if process.poll() is not None:
                log.close()
                codes[name] = process.returncode
                del running[name]
                say(f"[{time.monotonic() - start:7.0f}s] {'done' if process.returncode == 0 else 'FAILED'} "
                    f"{name} ({time.monotonic() - began:.0f}s, exit {process.returncode})")
        for job in list(waiting):
            if any(codes.get(a, 0) != 0 for a in job.after):
                codes[job.name] = -1
                waiting.remove(job)
                say(f"[{time.monotonic() - start:7.0f}s] skipped {job.name}: a job it waits for failed")
                continue
            if len(running) >= workers or any(a not in codes for a in job.after) or not job.ready(codes):
                continue
            job.before()
            job.log.parent.mkdir(parents=True, exist_ok=True)
            log = job.log.open("w")
            process = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **job.env})
            running[job.name] = (process, time.monotonic(), log)
            waiting.remove(job)
            say(f"[{time.monotonic() - start:7.0f}s] start {job.name}")
        if running and (waiting or running):
            time.sleep(poll_seconds)
        elif waiting and not running:
            # nothing runs and nothing can start: a `ready` that never holds
            for job in waiting:
                codes[job.name] = -1
                say(f"skipped {job.name}: not ready and nothing left to wait for")
            waiting = []
    return codes
