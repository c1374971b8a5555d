"""The CPU default: the built-in tiny model and tokenizer on SimpleSokoban (6×6, 1 box).

16 groups × 8 trajectories, 3 turns of up to 48 tokens, GRPO on rollouts at T 0.5 with Top-p 0.9
reward-variance filtering, MI diagnostics every 10 steps, validation on 128 levels × 8 samples
every 25 steps (`ragen_jax.config.tiny_cpu_config`), starting from the shipped supervised warm
start (`python -m ragen_jax.sft`, see README). 100 steps take about 16 minutes on a 2-core CPU;
docs/results.md has the start vs end validation success over 3 seeds."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    return tiny_cpu_config("SimpleSokoban", warm_start="builtin:sokoban-tiny")
