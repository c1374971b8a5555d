"""Writing a file so that a crash never leaves half of it: the text goes to a temporary file
beside it, which then replaces the target in one rename (atomic on POSIX file systems)."""

from __future__ import annotations

from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """`path` holds either its old content or all of `text`, whenever the process stops."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
