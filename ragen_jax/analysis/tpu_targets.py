"""Cloud TPU slices as the TPU compiler sees them, on any machine (`plan --target v5e-1`).

XLA's TPU compiler ships in libtpu (`pip install "ragen-jax[tpu]"`) and compiles for a TPU
topology that is not attached: `jax.experimental.topologies.get_topology_desc` returns devices
that can be compiled for but not run on. This module turns a Cloud TPU accelerator type
(`v5e-8`, `v6e-1`, `v4-8`, `v5p-8`, …) into that topology and holds each chip's published
figures (HBM, bfloat16 peak, HBM bandwidth) for the plan's fits, MFU and bandwidth bound.

Accelerator types count chips for v5e and v6e, TensorCores for v4 and v5p (two per chip, one
jax device per chip: megacore). Single-host slices (up to 8 chips of v5e/v6e, 4 of v4/v5p) are
laid out as one host; larger ones with the generation's chips per host.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re


class TargetError(ValueError):
    """A target the planner cannot compile for (printed as one line, exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's published figures (Cloud TPU documentation)."""

    generation: str  # as in the accelerator type and a topology's name ("v5e:2x2"): v4, v5e, v5p, v6e
    hbm_bytes: int
    peak_bf16_flops: float  # per second
    hbm_bytes_per_second: float
    counts_cores: bool  # the accelerator type counts TensorCores (2 per chip), not chips
    host_chips: tuple[int, int, int]  # chips per host on a multi-host slice
    dims: int  # 2-D (v5e, v6e) or 3-D (v4, v5p) topology


GIB = 2 ** 30

CHIPS = {
    "v4": Chip("v4", 32 * GIB, 275e12, 1228e9, True, (2, 2, 1), 3),
    "v5e": Chip("v5e", 16 * GIB, 197e12, 819e9, False, (2, 2, 1), 2),
    "v5p": Chip("v5p", 95 * GIB, 459e12, 2765e9, True, (2, 2, 1), 3),
    "v6e": Chip("v6e", 32 * GIB, 918e12, 1640e9, False, (2, 2, 1), 2),
}
ALIASES = {"v5litepod": "v5e", "v6e": "v6e", "v5e": "v5e", "v4": "v4", "v5p": "v5p"}
# Chips of a single-host slice (Cloud TPU: v5e/v6e hosts up to 8 chips, v4/v5p hosts 4).
SINGLE_HOST_CHIPS = {"v4": 4, "v5e": 8, "v5p": 4, "v6e": 8}


@dataclasses.dataclass(frozen=True)
class Target:
    """A Cloud TPU slice: its name, its chip, and the topology the compiler is given."""

    name: str  # the accelerator type as the user wrote it, normalised: "v5e-8"
    chip: Chip
    chips: int
    shape: tuple[int, ...]  # chips along each topology axis
    host_bounds: tuple[int, int, int]  # chips per host along each axis

    @property
    def topology(self) -> str:
        return f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"


def _shape(chips: int, dims: int) -> tuple[int, ...]:
    """The slice's chip grid as Cloud TPU lays it out: v5e/v6e grow y then x (1x1, 2x2, 2x4,
    4x4, 4x8, …); v4/v5p start from a 2x2x1 host and grow z, y, x (2x2x2, 2x2x4, 2x4x4, 4x4x4)."""
    if dims == 2:
        sides, order = [1, 1], (1, 0)
    else:
        sides, order = ([2, 2, 1] if chips < 8 else [2, 2, 2]), (2, 1, 0)
    doublings = chips.bit_length() - math.prod(sides).bit_length()
    for step in range(doublings):
        sides[order[step % len(order)]] *= 2
    return tuple(sides)


def parse_target(text: str) -> Target:
    """`v5e-8` (or `v5litepod-8`, `v6e-1`, `v4-8`, `v5p-8`) as a `Target`."""
    allowed = "v5e-N or v6e-N (N chips: 1, 4, 8, 16, …), v4-N or v5p-N (N TensorCores: 8, 16, …)"
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", text.strip().lower())
    if not match or match.group(1) not in ALIASES:
        raise TargetError(f"--target {text!r} is not a TPU accelerator type; allowed: {allowed}")
    chip = CHIPS[ALIASES[match.group(1)]]
    count = int(match.group(2))
    chips = count // 2 if chip.counts_cores else count
    if count < 1 or chips & (chips - 1) or (chip.counts_cores and (count % 2 or chips < 4)) \
            or (not chip.counts_cores and chips == 2):
        raise TargetError(f"--target {text!r}: no such slice of {chip.generation}; allowed: {allowed}")
    shape = _shape(chips, chip.dims)
    if chips <= SINGLE_HOST_CHIPS[chip.generation]:
        host = tuple(shape) + (1,) * (3 - len(shape))
    else:
        host = chip.host_chips
    return Target(f"{chip.generation}-{count}", chip, chips, shape, host)


# jax's device_kind of each generation's chip
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e"}


def attached_target(devices) -> Target | None:
    """The slice `devices` (jax's devices on a TPU host) form, or None off a TPU or for a chip
    this module has no figures for."""
    if not devices or devices[0].platform != "tpu" or devices[0].device_kind not in DEVICE_KINDS:
        return None
    chip = CHIPS[DEVICE_KINDS[devices[0].device_kind]]
    count = len(devices) * (2 if chip.counts_cores else 1)
    try:
        return parse_target(f"{chip.generation}-{count}")
    except TargetError:
        return None


def quiet_libtpu_environment(target: Target, environ=os.environ) -> None:
    """Before libtpu starts on a machine without a TPU: name the slice and this host so that
    libtpu does not look them up (a metadata query) and print errors about them, and let
    several processes compile at once (libtpu otherwise holds a lock file for the first: two
    plans, or two test workers). Values the user set are kept."""
    environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    environ.setdefault("TPU_ACCELERATOR_TYPE", target.name if target.chip.generation != "v5e"
                       else f"v5litepod-{target.chips}")
    environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    environ.setdefault("TPU_WORKER_ID", "0")


def libtpu_available() -> bool:
    """libtpu (the TPU compiler) is installed: `pip install "ragen-jax[tpu]"`."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


def compile_only_devices(target: Target) -> list:
    """The slice's devices, one per chip, for compiling (not running) programs."""
    if not libtpu_available():
        raise TargetError(f"--target {target.name} needs the TPU compiler: pip install \"ragen-jax[tpu]\" "
                          "(libtpu; it also runs on a machine without a TPU)")
    quiet_libtpu_environment(target)
    from jax.experimental import topologies

    options = {"chips_per_host_bounds": target.host_bounds}
    if target.chip.counts_cores:
        options["chip_config_name"] = "megacore"  # one device per chip, as jax runs v4 and v5p
    return list(topologies.get_topology_desc(target.topology, "tpu", **options).devices)


# The TPU compiler's messages when a program does not fit the chip's HBM.
_USED = re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm")
_TEMPS = re.compile(r"HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def out_of_memory(message: str) -> tuple[int, int, bool] | None:
    """(bytes needed, bytes available, whether `needed` is the whole program's need) from the
    TPU compiler's RESOURCE_EXHAUSTED message, or None when `message` is not one. When the
    temporaries alone exceed the chip, the compiler stops there: the need is at least that."""
    if "RESOURCE_EXHAUSTED" not in message:
        return None
    for pattern, whole in ((_USED, True), (_TEMPS, False)):
        match = pattern.search(message)
        if match:
            need, need_unit, have, have_unit = match.groups()
            return int(float(need) * _UNITS[need_unit]), int(float(have) * _UNITS[have_unit]), whole
    return None
