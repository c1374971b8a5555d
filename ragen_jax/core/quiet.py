"""What the commands leave out of a user's way: library notices, and PyTorch's import.

This package runs its models in JAX and uses transformers for tokenizers only. The commands'
main() turns transformers' advisory warnings off before it is imported (a
TRANSFORMERS_NO_ADVISORY_WARNINGS already set wins), among them its notice that PyTorch is
absent. A command started as a program (`python -m ragen_jax.train`) never imports PyTorch:
transformers and tensorboardX import it whenever it is installed, 2–3 s of every start, and
nothing here uses it. Importing ragen_jax as a library, or calling a main() from another
program, changes nothing of the kind.
"""

from __future__ import annotations

import os
import sys
from typing import Callable


def commands() -> None:
    """Called first in every command's main()."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def run_program(main: Callable[[], int | None]) -> int | None:
    """`main()` of a command started as a program, in a process that will not import PyTorch
    (`import torch` raises ImportError, which transformers and tensorboardX expect when it is
    not installed). Its exit code."""
    sys.modules.setdefault("torch", None)
    return main()
