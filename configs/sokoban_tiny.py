"""The CPU default: the built-in tiny model and tokenizer on SimpleSokoban (6×6, 1 box).

32 groups × 4 trajectories, 3 turns of up to 48 tokens, GRPO without an entropy bonus on
rollouts at T 0.5 with Top-p 0.9 reward-variance filtering, MI diagnostics every 10 steps,
validation on 128 levels × 8 samples every 50 steps (`ragen_jax.config.tiny_cpu_config`),
starting from the shipped supervised warm start (`python -m ragen_jax.sft`, see README). The
300 steps take about 11 minutes on a 2-core CPU and raise validation success from 0.330 to
0.41-0.44: +8.3 / +9.1 / +10.6 points over 3 seeds on the current code (docs/results.md §25),
+10.8 / +11.1 / +10.4 before a change of float summation order (§23)."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    return tiny_cpu_config("SimpleSokoban", warm_start="builtin:sokoban-tiny")
