"""Files the commands write: checked before any work, written so that a crash never leaves half
of one, and failures told in one line.

A write goes to a temporary file beside the target, which then replaces it in one rename
(atomic on POSIX file systems); a write that fails (a full disk) removes its temporary file.
Files get the mode open() would give them (0666 less the umask), also those written by
libraries that create theirs 0600 (`usual_mode`).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from ragen_jax.core.errors import ConfigError


def write_atomically(path: Path, text: str) -> None:
    """`path` holds either its old content or all of `text`, whenever the process stops."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):  # e.g. the temporary name is taken by a directory
            tmp.unlink(missing_ok=True)
        raise


def usual_mode(path: Path) -> None:
    """Give `path` the mode open() creates files with: 0666 less the umask. For files made by
    writers that create them 0600 (tempfile.mkstemp, safetensors), so they read like the rest."""
    umask = os.umask(0o077)  # the only way to read it; set back at once
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def check_writable_dir(path: Path, flag: str) -> None:
    """Raise a one-line ConfigError unless `path` is a directory this process may write in, or
    one it may create. Commands call it before any work, so a run does not end at its first
    write, and before writing anything, so a refused one leaves nothing behind."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a directory; choose a directory")
    existing = path.absolute()
    while not existing.exists():  # the directory that would hold the new ones
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {path} cannot be created: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else "permission denied"
        raise ConfigError(f"{flag} {path} is not writable ({existing}: {why})")


def describe(err: BaseException) -> str:
    """A failed write as one line: the OS's reason (and the file, when known). Libraries that
    write from native code (TensorStore, safetensors) put the OS error's number in their text."""
    text = str(err).split(" See full TensorStore details")[0].splitlines()  # it appends a long spec
    if isinstance(err, OSError):
        if err.strerror:
            return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
        return text[0] if text else type(err).__name__  # our own one-line OSErrors
    code = re.search(r"os[ _]error[ _](?:code=)?'?(\d+)", str(err))
    if code:
        return os.strerror(int(code.group(1)))
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__
