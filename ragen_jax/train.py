"""`python -m ragen_jax.train`: Train an agent (ragen_jax/cli/train.py)."""

import sys

from ragen_jax.cli.train import main
from ragen_jax.core import quiet

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
