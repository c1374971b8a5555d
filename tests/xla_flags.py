"""XLA flags for the test session and for the processes it starts.

Most of the suite's time is XLA compiling tiny graphs: LLVM's optimisation passes are a third
or more of that, and the CPU backend's default fusion emitters, which generate each of a train
step's ~1,800 kernels, much of the rest (with the older emitters a tiny train step's XLA compile
takes ≈ 40% less time, and the step runs ≈ 10% slower). The tests compare numbers
computed under the same flags (or against NumPy / PyTorch within float tolerances), so they run
at backend optimisation level 0 with XLA's older kernel emitters; a training run keeps XLA's
defaults."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def session_flags(devices: int = 8) -> str:
    """The flags the test session starts with: `devices` fake CPU devices, fast compiles."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"


def flags_for(devices: int | None) -> str:
    """This session's XLA_FLAGS for a child process with `devices` fake CPU devices (None:
    jax's default of one), everything else (fast compiles) kept."""
    from ragen_jax.core.host_devices import with_device_count

    return with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
