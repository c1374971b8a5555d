"""Library notices that do not concern a user of the commands, turned off at their source.

transformers warns on import that PyTorch is absent; this package runs its models in JAX and
uses transformers for tokenizers only. The commands' main() turns transformers' advisory
warnings off before it is imported (a TRANSFORMERS_NO_ADVISORY_WARNINGS already set wins);
importing ragen_jax as a library changes nothing.
"""

from __future__ import annotations

import os


def commands() -> None:
    """Called first in every command's main()."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
