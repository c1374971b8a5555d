"""One jax device per CPU core for a command's run.

XLA's CPU backend can present the host as several devices (`--xla_force_host_platform_device_count`).
On a mesh that splits only `data`, each device then plays its own rollout rows on one core
(`rollout.rollout_on_mesh`) instead of one device spreading every small op over all cores: a
Sokoban train step on 2 cores is 1.35x faster, its default run 15 -> 11 minutes
(docs/benchmarks.md). jax reads the flag when its CPU backend starts, so a command calls
`split_host` before anything asks jax for devices; an XLA_FLAGS that already names a count wins.
"""

from __future__ import annotations

import os
import re

COUNT_FLAG = "--xla_force_host_platform_device_count"


def with_device_count(flags: str, count: int | None) -> str:
    """XLA_FLAGS `flags` with `count` CPU devices instead of any count they had (None: no count,
    i.e. jax's one device); every other flag kept."""
    flags = re.sub(re.escape(COUNT_FLAG) + r"=\d+", "", flags).split()
    if count is not None:
        flags.append(f"{COUNT_FLAG}={count}")
    return " ".join(flags)


def device_count(cores: int, rows: tuple[int, ...]) -> int:
    """The most devices, at most `cores`, that split each of `rows` into whole rows."""
    return max(d for d in range(1, max(cores, 1) + 1) if all(r % d == 0 for r in rows))


def split_host(config, rows: tuple[int, ...] | None = None, cores: int | None = None,
               environ=os.environ) -> int | None:
    """Before jax starts: XLA_FLAGS gains one CPU device per core (as many as divide every count
    in `rows`; by default the train step's rollout batch and minibatch) when the config's mesh
    is plain data parallelism over all devices and XLA_FLAGS names no device count. Returns the
    count it set, or None when it set none. Only the CPU backend reads the flag: on an
    accelerator it changes nothing. `environ`: the environment to set it in (a child process's)."""
    flags = environ.get("XLA_FLAGS", "")
    mesh = config.mesh
    if COUNT_FLAG in flags or (mesh.data, mesh.fsdp, mesh.tensor) != (-1, 1, 1):
        return None
    if rows is None:
        rows = (config.rollout.num_groups * config.rollout.group_size, config.algo.mini_batch_size)
    count = device_count(cores or os.cpu_count() or 1, rows)
    if count == 1:
        return None
    environ["XLA_FLAGS"] = with_device_count(flags, count)
    return count


def note(count: int) -> str:
    """What a command prints (to stderr) when `split_host` set `count` devices."""
    return (f"note: one jax device per CPU core ({count}; on an accelerator this changes nothing); "
            "XLA_FLAGS=--xla_force_host_platform_device_count=1 keeps one")
