"""The CPU default: the built-in tiny model and tokenizer on SimpleSokoban (6×6, 1 box).

8 groups × 8 trajectories, 3 turns of up to 48 tokens, PPO with Top-p 0.9 reward-variance
filtering and MI diagnostics every 5 steps (`ragen_jax.config.tiny_cpu_config`), starting from the
shipped supervised warm start (`python -m ragen_jax.sft`, see README)."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    return tiny_cpu_config("SimpleSokoban", warm_start="builtin:sokoban-tiny")
