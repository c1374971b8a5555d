"""The CPU default on FrozenLake (4×4, slippery), same sizes as sokoban_tiny.py: 3 turns of
up to 2 moves. The lake slips less than gymnasium's (the intended move with probability 0.8
instead of 1/3): at 1/3 the best possible policy solves only 0.33 of the validation levels in 3
turns (0.48 in 5, at twice the step time), which leaves RL almost no room above the warm start;
at 0.8 the best possible policy solves 0.81 and the second-stage warm start 0.57
(`python benchmarks/reproduce.py ceiling --env frozenlake`, docs/tuning.md, "Warm starts"). Rewards stay
stochastic, where reward-variance filtering matters most; `--config.env.success_rate=0.333`
gives gymnasium's slip; `--config.rollout.shared_env_noise=true` gives a group's members the same
slips, as RAGEN's seeded envs do (no gain here, docs/tuning.md, "Levers on FrozenLake"). From
the second-stage warm start (`builtin:frozenlake-tiny`) RL gains only a few points: its mistakes
are mostly the same on every attempt, which leaves little for group-relative sharpening
(docs/tuning.md, "FrozenLake: the second stage and where it fails"); a warm start fitted with
`sft --name-holes` is much stronger (0.655) but RL loses from it ("FrozenLake: naming the holes").

Adam's ε is 1e-3 here (optax's 1e-8 elsewhere): parameters whose gradients are far below it —
the coordinate tokens' — then move in proportion to their gradient instead of by about the
learning rate, so the noise of ≈ 15 groups of slip-randomised rewards no longer rewrites the
reasoning's reading of the board (player cell right at the end 0.61-0.91 instead of 0.09-0.66),
and the run gains +3.3 / +3.7 / +5.3 over 3 seeds instead of +4.5 / +0.7 / -0.1
(docs/tuning.md, "What the defaults do and why"). `--config.algo.adam_eps=1e-8` gives optax's default.
With the tiny configs' micro-batches of 8 (same loss, another float summation order) the same
seeds gain -3.3 / +2.3 / +1.7 in about 6 minutes a run ("Run-to-run noise"): from the second stage
FrozenLake's gain is a few points of run-to-run noise around +2.

The default starts from `builtin:frozenlake-tiny-noisy` instead: the second stage fitted one
epoch more on demonstrations whose turns take a random first move with probability 0.7
(README), as the Sokoban default starts from a first-stage fit, so that the first run has
room. It reads the board as well (player cell right 99.9%), solves 0.403, and its mistakes
vary between attempts; RL removes its random moves within ≈ 50 steps and ends at 0.60
(+19.4 / +20.6 / +19.4 over 3 seeds), where RL from the second stage ends (docs/tuning.md,
"FrozenLake: a noisy third stage"). With one jax device per core, what `python -m
ragen_jax.train` sets up on a CPU: +20.4 / +20.4 / +17.8 in about 4 minutes a run on 2 cores
("The default runs")."""

from ragen_jax.run.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("FrozenLake", warm_start="builtin:frozenlake-tiny-noisy")
    c.env.success_rate = 0.8
    c.algo.adam_eps = 1e-3
    # 140 steps validated every 25, not the tiny default's 300: FrozenLake's gain comes in the
    # first 50-150 steps and longer runs lose it again (docs/tuning.md, "What the defaults do and why")
    c.train.update(steps=140, val_every=25)
    return c
