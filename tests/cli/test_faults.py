"""Faults a run survives, injected into the tiny config (tests/commands.py's shapes, 6 steps,
a checkpoint after every step):

- a run killed with SIGKILL at 3 seeded random points (while a checkpoint is being written; a
  seeded fraction of a step after a seeded step; while starting: importing, restoring,
  compiling) and started again after each; before its last start the latest checkpoint is
  damaged too. The last run moves that checkpoint aside and resumes from the newest good one.
- every file of a checkpoint truncated, zeroed, deleted and garbled in turn, and its file list
  garbled: `Checkpoints.verify` names each; without a file list, orbax's own failure leads to
  the same fallback. `train` with `train.skip_damaged=false` refuses in one line; `evaluate`
  and `export` name the damaged step and use the newest good one; a damaged `--step` is an
  error line.
- a workdir that is a file or under one, `export --out` under a file, a read-only workdir
  (train new and resumed, evaluate): one line, exit 2, nothing written; export reads a
  read-only workdir.
- a nearly full disk (a small tmpfs, where the tests may mount one: root): one line, exit 1,
  the previous checkpoint and the metrics intact; an export that fills it leaves nothing; a
  write that fails inside orbax's background thread is raised at the next poll.

Numbers: 3 kills in 4 starts of the same command, 3 of which resume; the last ends with 6 steps
of metrics bitwise those of an uninterrupted run and no partial checkpoint. 93 damaged files
named by `verify` (the 23 files of a checkpoint here × 4 kinds, and the file list), and 5 more
damaged checkpoints through `train` (2), `evaluate` with `export` (1) and `restore_newest`
(2). Kills are timed by what the run writes (a checkpoint's temporary
directory, a line of metrics) and seeded delays: where one lands varies with the machine's
speed, and any landing must resume exactly, so the verdict does not.
"""

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from ragen_jax.cli import evaluate, export, train
from ragen_jax.run import checkpoint
from ragen_jax.run.checkpoint import FILE_LIST, CheckpointError, Checkpoints, CheckpointWriteError

from commands import CONFIG, SMALL, command, one_error_line, records, same_records, start

STEPS = 6
RUN = ["--config", CONFIG, *SMALL, "--config.train.val_every=0", f"--config.train.steps={STEPS}",
       "--config.train.save_every=1", f"--config.train.keep_checkpoints={STEPS}"]


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def zero(path):
    path.write_bytes(bytes(path.stat().st_size))


def delete(path):
    path.unlink()


def garble(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": truncate, "zeroed": zero, "deleted": delete, "garbled": garble}


def data_file(workdir, step):
    """The checkpoint's largest file: OCDBT data holding most of the arrays."""
    return max((p for p in (workdir / "checkpoints" / str(step)).rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def partial_checkpoints(workdir):
    return sorted(p.name for p in (workdir / "checkpoints").iterdir() if not p.name.isdigit())


@contextlib.contextmanager
def tmpfs(path, size_kb):
    """A tmpfs of `size_kb` at `path`; the test is skipped where it cannot be mounted."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def read_only_copy(source, path):
    """A copy of `source` that this process cannot write: a read-only tmpfs as root (whom file
    permissions do not stop), the permissions elsewhere."""
    if os.geteuid() == 0:
        with tmpfs(path, 64 << 10):
            shutil.copytree(source, path / "run")
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
            yield path / "run"
        return
    shutil.copytree(source, path / "run")
    dirs = [path / "run", *(p for p in (path / "run").rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    try:
        yield path / "run"
    finally:
        for d in dirs:
            d.chmod(0o755)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, every checkpoint kept."""
    workdir = tmp_path_factory.mktemp("reference")
    done = command("ragen_jax.train", *RUN, "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr[-2000:]
    return workdir


@pytest.fixture(scope="module")
def like(reference):
    """A fresh train state of the reference run's config: the template restores fill."""
    from ragen_jax.run.experiment import make_experiment

    exp = make_experiment(ml_collections.ConfigDict(json.loads((reference / "config.json").read_text())))
    return exp.trainer().init_state(jax.random.key(0), exp.model)


# ----------------------------------------------------------------------------- kills


def kill_when(proc, ready, delay) -> bool:
    """SIGKILL `proc` `delay()` seconds after `ready()` first holds; True if it died of it."""
    while proc.poll() is None and not ready():
        time.sleep(0.002)
    time.sleep(delay())
    proc.kill()
    return proc.wait() == -signal.SIGKILL


def test_killed_at_random_points_and_damaged_it_resumes_exactly(reference, tmp_path):
    rng = random.Random(47)
    args = [*RUN, "--workdir", str(tmp_path)]
    metrics = tmp_path / "metrics.jsonl"
    lines = lambda: metrics.read_text().count("\n") if metrics.exists() else 0  # complete lines
    kills = []
    # while the checkpoint of a seeded step is being written (or just after, on a slow poll)
    step, delay = rng.randint(1, STEPS - 3), rng.uniform(0, 0.02)
    written = lambda: any((tmp_path / "checkpoints").glob(f"{step}.orbax-checkpoint-tmp*")) or (
        tmp_path / "checkpoints" / str(step)).is_dir()
    kills.append(kill_when(start("ragen_jax.train", *args), written, lambda: delay))
    # within the step after a seeded new line of metrics: a seeded fraction of a step's time
    line, fraction = rng.randint(lines() + 1, STEPS - 2), rng.random()
    kills.append(kill_when(start("ragen_jax.train", *args), lambda: lines() >= line,
                           lambda: fraction * records(tmp_path)[line - 1]["time/step_seconds"]))
    # while starting: importing, restoring, truncating the metrics, compiling
    delay = rng.uniform(0.5, 3)
    kills.append(kill_when(start("ragen_jax.train", *args), lambda: True, lambda: delay))
    assert kills == [True, True, True]
    # and the latest checkpoint damaged, in a way orbax also notices (the run may have been
    # killed before writing its file list)
    latest = max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    broken = rng.choice([(data_file(tmp_path, latest), truncate), (data_file(tmp_path, latest), zero),
                         (data_file(tmp_path, latest), delete),
                         (tmp_path / "checkpoints" / str(latest) / "state" / "_METADATA", garble)])
    broken[1](broken[0])

    done = command("ragen_jax.train", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    warning = done.stderr.splitlines()[0]
    assert warning.startswith(f"warning: checkpoint {tmp_path / 'checkpoints' / str(latest)} ")
    assert warning.endswith(f"moved it to {tmp_path / 'damaged_checkpoints' / str(latest)}")
    assert (tmp_path / "damaged_checkpoints" / str(latest) / "state").is_dir()  # kept, never deleted
    assert [r["step"] for r in records(tmp_path)] == list(range(1, STEPS + 1))
    assert same_records(records(reference), records(tmp_path))
    assert partial_checkpoints(tmp_path) == []


# ----------------------------------------------------------------------------- damage


def test_every_kind_of_damage_to_every_file_is_named(reference, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    checkpoints = Checkpoints(work, read_only=True)
    latest = work / "checkpoints" / str(STEPS)
    files = sorted(p for p in latest.rglob("*") if p.is_file() and p.name != FILE_LIST)
    names = {p.relative_to(latest).as_posix() for p in files}  # the whole directory: metadata, manifests, data
    assert {"_CHECKPOINT_METADATA", "state/_METADATA", "state/manifest.ocdbt"} <= names
    assert any("/d/" in name for name in names)  # OCDBT's data files: how many varies with the writer's batching
    tried = 0
    for path in files:
        original = path.read_bytes()
        for damage in DAMAGE.values():
            damage(path)
            with pytest.raises(CheckpointError, match=re.escape(f"{latest} is damaged: {path.relative_to(latest)} ")):
                checkpoints.verify(STEPS)
            path.write_bytes(original)
            tried += 1
    garble(latest / FILE_LIST)
    with pytest.raises(CheckpointError, match=f"its {FILE_LIST} is unreadable"):
        checkpoints.verify(STEPS)
    assert tried + 1 == 4 * len(files) + 1
    checkpoints.close()


def test_the_newest_checkpoint_that_restores_is_used(reference, like, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    zero(data_file(work, STEPS))
    checkpoints = Checkpoints(work, read_only=True)
    step, state, damaged = checkpoints.restore_newest(lambda s: checkpoints.restore(s, like))
    assert step == STEPS - 1 and int(state.step) == STEPS - 1
    assert [s for s, _ in damaged] == [STEPS] and "does not match its checksum" in str(damaged[0][1])
    # without a file list (a run killed before writing it) orbax's own failure falls back alike
    (work / "checkpoints" / str(STEPS) / FILE_LIST).unlink()
    step, _, damaged = checkpoints.restore_newest(lambda s: checkpoints.restore(s, like))
    assert step == STEPS - 1 and "could not be restored" in str(damaged[0][1])

    # when no checkpoint restores, the code or config is at fault: the newest's error, nothing set aside
    def never(s):
        raise CheckpointError(f"step {s} does not fit")

    with pytest.raises(CheckpointError, match=f"step {STEPS} does not fit"):
        checkpoints.restore_newest(never)
    checkpoints.close()


def test_skip_damaged_false_refuses_in_one_line(reference, tmp_path, capsys):
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    truncate(data_file(work, STEPS))
    before = snapshot(work)
    line = one_error_line(capsys, train.main([*RUN, "--workdir", str(work), "--config.train.skip_damaged=false"]))
    assert f"checkpoint {work / 'checkpoints' / str(STEPS)} is damaged: " in line
    assert "instead of" in line and "train.skip_damaged=false" in line
    assert snapshot(work) == before  # nothing moved, nothing truncated


def test_evaluate_and_export_use_the_newest_good_checkpoint(reference, tmp_path, capsys):
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    delete(data_file(work, STEPS))
    good = STEPS - 1
    (work / f"eval_{good}.json.tmp").mkdir()  # the results file cannot be written
    code = evaluate.main(["--workdir", str(work), "--episodes", "2", "--samples", "2"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.startswith(f"step {good}: 2 episodes") and "pass@2" in out  # printed before the write failed
    warning, error = err.strip().splitlines()
    assert warning.startswith(f"warning: checkpoint {work / 'checkpoints' / str(STEPS)} is damaged: ")
    assert warning.endswith(f"is missing; using step {good}, the newest checkpoint that restores")
    assert error.startswith("error: the results above were not saved: Is a directory")
    assert not (work / f"eval_{good}.json").exists()

    line = one_error_line(capsys, evaluate.main(["--workdir", str(work), "--step", str(STEPS)]))
    assert f"{STEPS} is damaged" in line

    assert export.main(["--workdir", str(work), "--out", str(tmp_path / "hf")]) == 0
    out, err = capsys.readouterr()
    assert f"exported step {good}" in out and f"using step {good}" in err
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert (work / "checkpoints" / str(STEPS)).is_dir()  # readers move nothing


# ----------------------------------------------------------------------------- the workdir


def test_a_workdir_that_is_a_file_or_under_one(reference, tmp_path, capsys):
    from ragen_jax.cli import sft

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    line = one_error_line(capsys, train.main([*RUN, "--workdir", str(notes)]))
    assert line == f"error: --workdir {notes} is a file, not a directory; choose a directory"
    line = one_error_line(capsys, sft.main(["--config", CONFIG, "--workdir", str(notes / "run")]))
    assert line == f"error: --workdir {notes / 'run'} cannot be created: {notes} is a file, not a directory"
    line = one_error_line(capsys, export.main(["--workdir", str(reference), "--out", str(notes / "hf")]))
    assert line == f"error: --out {notes / 'hf'} cannot be created: {notes} is a file, not a directory"
    assert notes.read_text() == "mine" and list(tmp_path.iterdir()) == [notes]


def test_a_read_only_workdir_is_refused_before_any_work(reference, tmp_path, capsys):
    with read_only_copy(reference, tmp_path / "ro") as work:
        before = snapshot(work)
        for argv in ([*RUN, "--workdir", str(work)], [*RUN, "--workdir", str(work / "new")]):
            line = one_error_line(capsys, train.main(argv))
            assert line.startswith(f"error: --workdir {argv[-1]} is not writable (")
        line = one_error_line(capsys, evaluate.main(["--workdir", str(work)]))
        assert line.startswith(f"error: --workdir {work} is not writable (")
        assert export.main(["--workdir", str(work), "--out", str(tmp_path / "hf")]) == 0  # reading is fine
        assert snapshot(work) == before


# ----------------------------------------------------------------------------- a full disk


def test_a_nearly_full_disk_stops_the_run_in_one_line(reference, tmp_path):
    """The run resumes from step 5 on a disk with less room than a checkpoint takes: step 6
    is trained and logged, its checkpoint is refused before orbax writes anything."""
    names = ["config.json", "metrics.jsonl", f"checkpoints/{STEPS - 1}"]
    used = sum(p.stat().st_size for name in names for p in [reference / name, *(reference / name).rglob("*")]
               if p.is_file())
    with tmpfs(tmp_path / "disk", used // 1024 + 2048) as disk:  # 2 MiB more: less than a checkpoint needs
        work = disk / "run"
        for name in names:
            copy = shutil.copytree if (reference / name).is_dir() else shutil.copy
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            copy(reference / name, work / name)
        before = snapshot(work / "checkpoints")
        done = command("ragen_jax.train", *RUN, "--workdir", str(work))
        assert done.returncode == 1, done.stderr[-2000:]
        resuming, error = done.stderr.splitlines()
        assert resuming == f"resuming {work} from step {STEPS - 1}"
        assert error.startswith(f"error: checkpoint {work / 'checkpoints' / str(STEPS)} not written: its disk has ")
        assert snapshot(work / "checkpoints") == before  # the previous checkpoint intact, nothing partial
        assert same_records(records(reference), records(work))  # step 6 was logged before its save
        Checkpoints(work, read_only=True).verify(STEPS - 1)


def test_an_export_to_a_full_disk_leaves_nothing(reference, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", 512) as disk:  # a third of the exported weights
        line = one_error_line(capsys, export.main(["--workdir", str(reference), "--out", str(disk / "hf")]), 1)
        assert line == f"error: nothing exported to {disk / 'hf'}: No space left on device"
        assert list(disk.iterdir()) == []


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_write_that_fails_in_the_background_stops_at_the_next_poll(like, tmp_path, monkeypatch):
    """The disk fills while orbax writes (the room check passed): the failure, raised in
    orbax's thread, is raised by the next `poll` without waiting for anything else; orbax's
    transfers that end after it print nothing (an unraisable exception fails this test)."""
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=1 << 40))
    with tmpfs(tmp_path / "disk", 16 << 10) as disk:
        checkpoints = Checkpoints(disk / "run")
        checkpoints.save(like.replace(step=jnp.int32(1)))
        checkpoints.settle()
        first = snapshot(disk / "run" / "checkpoints" / "1")
        size = sum(len(data) for data in first.values())
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(bytes(free - size // 2))  # room for half a checkpoint
        checkpoints.save(like.replace(step=jnp.int32(2)))
        with pytest.raises(CheckpointWriteError, match="checkpoints/2 could not be written: No space left on device"):
            for _ in range(1200):
                checkpoints.poll()
                time.sleep(0.05)
        assert checkpoints.steps() == [1] and partial_checkpoints(disk / "run") == []
        checkpoints.close()
        assert snapshot(disk / "run" / "checkpoints" / "1") == first
        checkpoints.verify(1)


def test_orbax_leftovers_are_dropped_and_other_unraisables_kept(monkeypatch):
    """A callback reporting to a closed event loop, an orbax coroutine closed after its failure:
    dropped; any other unraisable exception: passed on."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint._quiet_orbax_leftovers()
    checkpoint._quiet_orbax_leftovers()  # installed once
    loop = asyncio.new_event_loop()
    loop.close()

    class Late:  # a transfer's callback that reports to its closed loop
        def __del__(self):
            loop.call_soon_threadsafe(print)

    class Broken:
        def __del__(self):
            raise ValueError("kept")

    @types.coroutine
    def pause():
        yield

    async def read_left_running():  # an orbax read closed after its checkpoint failed
        try:
            await pause()
        finally:
            raise OSError("read after the failure")

    Late()
    Broken()
    monkeypatch.setattr(checkpoint, "_ORBAX", os.path.dirname(__file__))  # as if defined in orbax
    left = read_left_running()
    left.send(None)
    del left  # closed by the garbage collector: its OSError is unraisable
    assert [type(u.exc_value) for u in seen] == [ValueError]
