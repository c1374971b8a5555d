"""`python -m ragen_jax.plot`: Plot a run's training curves (ragen_jax/cli/plot.py)."""

import sys

from ragen_jax.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
