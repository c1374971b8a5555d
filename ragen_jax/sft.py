"""`python -m ragen_jax.sft`: Supervised warm start from solver demonstrations (ragen_jax/cli/sft.py)."""

import sys

from ragen_jax.cli.sft import main
from ragen_jax.core import quiet

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
