"""A persistent XLA compilation cache for the commands (train, evaluate, sft).

Most of a short run's time is compilation: the first step of FrozenLake's tiny config takes 28 s,
the later ones 1.5 s. JAX can keep compiled programs on disk and load them instead of compiling
them again, so the commands turn its cache on: a second run of the same config (another seed),
a resume after a crash and an evaluation of the same shapes then start in seconds. The programs
are keyed by their HLO, the compile options and the jax version, so a hit is the same program
(the exact-resume test runs through the cache).

Where: $RAGEN_JAX_COMPILE_CACHE, else $XDG_CACHE_HOME/ragen_jax/jax (~/.cache/ragen_jax/jax),
at most MAX_BYTES (the least recently used programs evicted). RAGEN_JAX_COMPILE_CACHE=off turns it
off; JAX's own JAX_COMPILATION_CACHE_DIR, when set, is used as it is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ENV = "RAGEN_JAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "none", "")
MAX_BYTES = 4 << 30


def cache_dir(environ=os.environ) -> Path | None:
    """The directory the commands cache compiled programs in (None: off)."""
    chosen = environ.get(ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in OFF else Path(chosen).expanduser()
    base = environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ragen_jax" / "jax"


def enable(environ=os.environ) -> Path | None:
    """Turn JAX's persistent compilation cache on at `cache_dir()` unless JAX already has a cache
    directory (JAX_COMPILATION_CACHE_DIR) or it is off. Returns the directory in use. A directory
    that cannot be written is reported in one stderr line and the run goes on without a cache."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    where = cache_dir(environ)
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        print(f"note: no compilation cache ({ENV}={where}: {err.strerror or err}); every program is compiled afresh",
              file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(where))
    # a bound unless the user set one; JAX's eviction locks the directory with `filelock`
    if jax.config.jax_compilation_cache_max_size == -1 and importlib.util.find_spec("filelock"):
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return where
