"""The error every command reports as one line with exit code 2: a user's mistake in the
configuration or the command line (kept apart from `config` so that modules which only raise
it import no jax)."""


class ConfigError(ValueError):
    """A user mistake in the configuration (printed as one line, exit code 2)."""
