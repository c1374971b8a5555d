"""What the commands leave out of a user's way: library notices, PyTorch's import, and a TPU
runtime's probe on a machine without a TPU.

This package runs its models in JAX and uses transformers for tokenizers only. The commands'
main() turns transformers' advisory warnings off before it is imported (a
TRANSFORMERS_NO_ADVISORY_WARNINGS already set wins), among them its notice that PyTorch is
absent. A command started as a program (`python -m ragen_jax.train`) never imports PyTorch:
transformers and tensorboardX import it whenever it is installed, 2–3 s of every start, and
nothing here uses it. Importing ragen_jax as a library, or calling a main() from another
program, changes nothing of the kind.

With libtpu installed (the `tpu` extra: TPU hosts, and planning for a TPU on any machine), jax
starts the TPU runtime at its first device query even where no TPU is attached, which prints
errors and costs time before it falls back to the CPU. The commands skip that probe on a
machine with neither a TPU nor a GPU (`skip_absent_tpu`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of Google's vendor id


def commands() -> None:
    """Called first in every command's main()."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if skip_absent_tpu() and "jax" in sys.modules:  # imported already: its config read the environment then
        sys.modules["jax"].config.update("jax_platforms", "cpu")


def tpu_attached(pci_devices: Path = Path("/sys/bus/pci/devices")) -> bool:
    """A TPU chip is on this machine's PCI bus."""
    try:
        vendors = [(device / "vendor").read_text().strip() for device in pci_devices.iterdir()]
    except OSError:
        return False
    return GOOGLE_PCI_VENDOR in vendors


def gpu_attached(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA or AMD GPU's driver is present (their jax plugins then pick the backend)."""
    return (dev / "nvidiactl").exists() or (dev / "kfd").exists()


def skip_absent_tpu(environ=os.environ, pci_devices: Path = Path("/sys/bus/pci/devices"),
                    dev: Path = Path("/dev")) -> bool:
    """With libtpu installed on a machine with no TPU and no GPU: jax runs on the CPU without
    first starting the TPU runtime (JAX_PLATFORMS=cpu; the TPU compiler stays usable through
    `jax.experimental.topologies`). A JAX_PLATFORMS the user set wins. Returns whether it
    set it. Called before jax's first device query."""
    if environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return False
    if tpu_attached(pci_devices) or gpu_attached(dev):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


def run_program(main: Callable[[], int | None]) -> int | None:
    """`main()` of a command started as a program, in a process that will not import PyTorch
    (`import torch` raises ImportError, which transformers and tensorboardX expect when it is
    not installed). Its exit code."""
    sys.modules.setdefault("torch", None)
    return main()
