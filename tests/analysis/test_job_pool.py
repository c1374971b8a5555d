"""The job pool: jobs start in order, never more than the workers at once, after the
jobs they wait for; a failed job's dependants are skipped and the rest go on; a stopped pool
stops its jobs gently."""

import signal
import subprocess
import sys
import time

import pytest

from ragen_jax.analysis.job_pool import Job, run_jobs


def job(tmp_path, name, code="", after=(), **kw):
    """A job that appends its name to `order.txt` when it starts and ends, then runs `code`."""
    order = tmp_path / "order.txt"
    script = "\n".join(["import time", f"open({str(order)!r}, 'a').write('start {name}\\n')", "time.sleep(0.3)",
                        code, f"open({str(order)!r}, 'a').write('end {name}\\n')"])
    return Job(name, [sys.executable, "-c", script], tmp_path / "logs" / f"{name}.log", after, **kw)


def events(tmp_path):
    return (tmp_path / "order.txt").read_text().split("\n")[:-1]


def test_workers_bound_and_prerequisites_are_kept(tmp_path):
    jobs = [job(tmp_path, "a"), job(tmp_path, "b"), job(tmp_path, "c", after=("a", "b")), job(tmp_path, "d")]
    lines = []
    codes = run_jobs(jobs, workers=2, poll_seconds=0.05, say=lines.append)
    assert codes == {"a": 0, "b": 0, "c": 0, "d": 0}
    seen, running, most = events(tmp_path), set(), 0
    for event in seen:
        kind, name = event.split()
        running = running | {name} if kind == "start" else running - {name}
        most = max(most, len(running))
    assert most <= 2
    assert seen.index("start c") > max(seen.index("end a"), seen.index("end b"))
    said = [" ".join(line.split("] ", 1)[1].split()[:2]) for line in lines]  # "start d", "done c", ...
    assert said.index("start d") < said.index("done c")  # d needs nothing: it does not wait behind c
    assert sum("done" in line for line in lines) == 4


def test_a_failed_job_skips_its_dependants_only(tmp_path):
    jobs = [job(tmp_path, "bad", code="raise SystemExit(3)"), job(tmp_path, "after_bad", after=("bad",)),
            job(tmp_path, "other")]
    lines = []
    codes = run_jobs(jobs, workers=1, poll_seconds=0.05, say=lines.append)
    assert codes == {"bad": 3, "after_bad": -1, "other": 0}
    assert "start after_bad" not in events(tmp_path)
    assert any("FAILED bad" in line for line in lines) and any("skipped after_bad" in line for line in lines)


def test_ready_and_before_and_environment(tmp_path):
    flag = tmp_path / "flag"
    made = []
    waits = job(tmp_path, "waits", ready=lambda ended: flag.exists(), before=lambda: made.append("before"))
    writes = Job("writes", [sys.executable, "-c", f"import os, pathlib; pathlib.Path({str(flag)!r}).write_text("
                            "os.environ['POOL_TEST'])"], tmp_path / "logs" / "writes.log", env={"POOL_TEST": "x"})
    assert run_jobs([waits, writes], workers=2, poll_seconds=0.05, say=lambda _: None) == {"writes": 0, "waits": 0}
    assert flag.read_text() == "x" and made == ["before"]
    never = job(tmp_path, "never", ready=lambda ended: False)
    assert run_jobs([never], workers=1, poll_seconds=0.05, say=lambda _: None) == {"never": -1}


def test_bad_plans_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        run_jobs([job(tmp_path, "a"), job(tmp_path, "a")], workers=1)
    with pytest.raises(ValueError, match="unknown jobs: \\['z'\\]"):
        run_jobs([job(tmp_path, "a", after=("z",))], workers=1)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_pool_passes_sigterm_to_its_jobs_and_waits_for_them(tmp_path, signum, code):
    """SIGTERM or Ctrl-C to the pool alone: each running job gets SIGTERM (here it writes a file
    and exits 143, as a train run saves a checkpoint and does), the pool waits and says Stopped."""
    job_code = ("import pathlib, signal, sys, time\n"
                "def bye(*_):\n"
                f"    pathlib.Path({str(tmp_path)!r}, sys.argv[1]).write_text('saved'); sys.exit(143)\n"
                "signal.signal(signal.SIGTERM, bye)\n"
                f"pathlib.Path({str(tmp_path)!r}, sys.argv[1] + '.up').write_text('')\n"
                "time.sleep(60)\n")
    # the pool takes Ctrl-C as in a terminal even where the suite itself was started with SIGINT
    # ignored (a background job of a non-interactive shell), whose children would inherit that
    pool_code = ("import signal, sys\n"
                 "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                 "from pathlib import Path\n"
                 "from ragen_jax.analysis.job_pool import Job, Stopped, run_jobs\n"
                 f"jobs = [Job(n, [sys.executable, '-c', {job_code!r}, n], Path({str(tmp_path)!r}, n + '.log')) "
                 "for n in ('a', 'b', 'c')]\n"
                 "try:\n"
                 "    run_jobs(jobs, workers=2, poll_seconds=0.05, say=lambda _: None)\n"
                 "except Stopped as stop:\n"
                 "    print(stop.jobs); sys.exit(stop.exit_code)\n")
    pool = subprocess.Popen([sys.executable, "-c", pool_code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"{n}.up").exists() for n in "ab") and time.monotonic() < deadline:
        time.sleep(0.05)
    pool.send_signal(signum)  # once: the pool acts on it between its steps
    out, _ = pool.communicate(timeout=60)
    assert pool.returncode == code and out.strip() == "['a', 'b']"
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text() == "saved"
    assert not (tmp_path / "c.up").exists()  # never started
