"""`python -m ragen_jax.export`: Export a run's policy as a Hugging Face directory (ragen_jax/cli/export.py)."""

import sys

from ragen_jax.cli.export import main
from ragen_jax.core import quiet

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
