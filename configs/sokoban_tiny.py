"""The CPU default: the built-in tiny model and tokenizer on SimpleSokoban (6×6, 1 box).

32 groups × 4 trajectories, 3 turns of up to 48 tokens, GRPO without an entropy bonus on
rollouts at T 0.5 with Top-p 0.9 filtering on the reward std, MI diagnostics every 10 steps,
validation on 128 levels × 8 samples every 50 steps (`ragen_jax.run.config.tiny_cpu_config`),
starting from the shipped supervised warm start (`python -m ragen_jax.sft`, see README).

400 steps, the last 150 at a learning rate falling linearly to 0 (`algo.lr_decay_fraction`,
warm-up-stable-decay without the warm-up). The run takes about 10 minutes on 2 Zen 5 cores, about
3.4× that on 2 Zen 3 cores (docs/benchmarks.md: CPU-B, CPU-A; `python -m ragen_jax.train` gives
it one jax device per core, `ragen_jax/core/host_devices.py`)
and raises validation success from 0.330 to 0.44-0.46: +11.2 / +12.8 / +12.4 points over 3
seeds (docs/tuning.md, "The default runs"). Why 400 steps and a falling rate: at a constant rate on one
device the same seeds gain +8.3 / +9.1 / +10.6 in 300 steps and +12.1 / +11.2 / +11.3 in 400
(docs/tuning.md, "Run-to-run noise"), so most of the margin is the extra steps; the falling rate adds
about a point and ends the seeds closer together. `--config.algo.lr_decay_fraction=0` keeps
the rate constant."""

from ragen_jax.run.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("SimpleSokoban", warm_start="builtin:sokoban-tiny")
    c.train.steps = 400
    c.algo.lr_decay_fraction = 0.375  # the last 150 steps (a shorter --config.train.steps: its last 37.5%)
    return c
