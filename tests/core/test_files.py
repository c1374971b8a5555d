"""A file written by a command holds its old content or all of the new one, never a part."""

from pathlib import Path

import pytest

from ragen_jax.core.files import write_atomically


def test_write_atomically_replaces_the_whole_file(tmp_path):
    target = tmp_path / "eval_6.json"
    write_atomically(target, "old")
    write_atomically(target, "new " * 1000)
    assert target.read_text() == "new " * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["eval_6.json"]


def test_a_crash_before_the_rename_leaves_the_old_content(tmp_path, monkeypatch):
    target = tmp_path / "metrics.jsonl"
    target.write_text("step 1\nstep 2\n")

    def crash(self, other):
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, "step 1\n")
    assert target.read_text() == "step 1\nstep 2\n"


def test_written_files_get_the_mode_open_gives(tmp_path):
    """0666 less the umask, also for files a library creates 0600 (tempfile, safetensors)."""
    import os
    import stat
    import tempfile

    from ragen_jax.core.files import usual_mode

    umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "eval_6.json", "{}")
        fd, private = tempfile.mkstemp(dir=tmp_path)
        os.close(fd)
        usual_mode(private)
        assert os.umask(0o027) == 0o027  # usual_mode left the umask as it was
    finally:
        os.umask(umask)
    for path in (tmp_path / "eval_6.json", private):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
