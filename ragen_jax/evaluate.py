"""`python -m ragen_jax.evaluate`: Evaluate a run's checkpoint (ragen_jax/cli/evaluate.py)."""

import sys

from ragen_jax.cli.evaluate import main
from ragen_jax.core import quiet

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
