"""ragen_jax: multi-turn agent RL in JAX, with SNR-aware filtering and MI diagnostics."""

__version__ = "0.1.0"
