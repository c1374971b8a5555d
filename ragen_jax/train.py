"""`python -m ragen_jax.train`: Train an agent (ragen_jax/cli/train.py)."""

import sys

from ragen_jax.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
