"""Run command-line jobs as subprocesses, a few at a time, each after the jobs it waits for.

The study's runs are independent programs but for a few orderings (Top-k is matched to the
finished Top-p runs; an env's runs read the initial policy's validation its first run writes; a
run starts without compiling once the first run of its arm has filled the compilation cache),
so `benchmarks/reproduce.py study --jobs N` hands them to this pool (`study_jobs.py` plans them):
N processes share the host's cores or one accelerator. A job whose prerequisite failed is not
started; the others go on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
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


class Stopped(Exception):
    """Ctrl-C or SIGTERM reached the pool: its running jobs were sent SIGTERM and have ended."""

    def __init__(self, exit_code: int, jobs: list[str]):
        super().__init__(f"stopped with {len(jobs)} jobs running")
        self.exit_code, self.jobs = exit_code, jobs


def run_jobs(jobs: list[Job], workers: int, poll_seconds: float = 1.0, say=print) -> dict[str, int]:
    """Run `jobs`, at most `workers` at once, each in list order as soon as its prerequisites
    succeeded and `ready` holds. Returns {name: exit code}; a job never started because a
    prerequisite failed gets -1. `say` gets one line per start and end. On Ctrl-C or SIGTERM the
    running jobs get SIGTERM (a train run then saves a checkpoint), the pool waits for them and
    raises `Stopped` (exit code 130 or 143, the jobs that were running)."""
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be unique")
    unknown = {a for job in jobs for a in job.after} - set(names)
    if unknown:
        raise ValueError(f"jobs wait for unknown jobs: {sorted(unknown)}")
    running: dict[str, tuple[subprocess.Popen, float, object]] = {}
    stop = _StopRequest()
    # SIGTERM always; Ctrl-C unless this process ignores it (a non-interactive shell's background job)
    handled = [signum for signum in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(signum) is not signal.SIG_IGN]
    handled = handled if threading.current_thread() is threading.main_thread() else []
    previous = {signum: signal.signal(signum, stop.handler) for signum in handled}
    try:
        codes = _run(list(jobs), workers, poll_seconds, say, running, stop)
        if stop.signum is None:
            return codes
        for process, _, _ in running.values():
            process.terminate()
        for process, _, log in running.values():
            process.wait()
            log.close()
        raise Stopped(128 + stop.signum, sorted(running))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _StopRequest:
    """Ctrl-C or SIGTERM, noted by the signal handler and acted on by the pool's loop between
    its steps. Raising from the handler instead could interrupt `Popen.poll` while it holds the
    process's wait lock, and the pool's later `wait` would then block for ever."""

    def __init__(self):
        self.signum: int | None = None

    def handler(self, signum, frame):
        self.signum = signum


def _run(waiting: list[Job], workers: int, poll_seconds: float, say, running: dict, stop: _StopRequest) -> dict[str, int]:
    """`run_jobs`' loop, until every job has ended or `stop` is asked for: `running` (name ->
    process, start time, log) is the caller's, so that a stop can reach the processes."""
    codes: dict[str, int] = {}
    start = time.monotonic()
    while (waiting or running) and stop.signum is None:
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
            if stop.signum is not None:
                break
            job.before()
            job.log.parent.mkdir(parents=True, exist_ok=True)
            log = job.log.open("w")
            process = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **job.env})
            running[job.name] = (process, time.monotonic(), log)
            waiting.remove(job)
            say(f"[{time.monotonic() - start:7.0f}s] start {job.name}")
        if running:
            time.sleep(poll_seconds)
        elif waiting:
            # nothing runs and nothing can start: a `ready` that never holds
            for job in waiting:
                codes[job.name] = -1
                say(f"skipped {job.name}: not ready and nothing left to wait for")
            waiting = []
    return codes
