"""XLA flags for the test session and for the processes it starts.

Most of the suite's time is XLA compiling tiny graphs, and LLVM's optimisation passes are a
third or more of that. The tests compare numbers computed at the same level (or against
NumPy / PyTorch within float tolerances), so they run at backend optimisation level 0; a
training run keeps XLA's default."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"


def session_flags(devices: int = 8) -> str:
    """The flags the test session starts with: `devices` fake CPU devices, fast compiles."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"


def flags_for(devices: int | None) -> str:
    """This session's XLA_FLAGS for a child process with `devices` fake CPU devices (None:
    jax's default of one), everything else (fast compiles) kept."""
    from ragen_jax.run.host_devices import with_device_count

    return with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
