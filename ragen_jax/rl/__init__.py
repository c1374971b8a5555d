"""RL math: advantages, losses and SNR-aware filtering (pure array functions)."""
