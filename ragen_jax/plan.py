"""`python -m ragen_jax.plan`: Plan memory and FLOPs for a model size and mesh (ragen_jax/cli/plan.py)."""

import sys

from ragen_jax.cli.plan import main
from ragen_jax.core import quiet

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
