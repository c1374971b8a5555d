"""The CPU default on FrozenLake (4×4, slippery), same sizes as sokoban_tiny.py: 3 turns of
up to 2 moves. The lake slips less than gymnasium's (the intended move with probability 0.8
instead of 1/3): at 1/3 the best possible policy solves only 0.33 of the validation levels in 3
turns (0.48 in 5, at twice the step time), which leaves RL almost no room above the warm start;
at 0.8 the best possible policy solves 0.81 and the warm start 0.57
(`python benchmarks/reproduce.py ceiling --env frozenlake`, docs/results.md §8, §13). Rewards stay
stochastic, where reward-variance filtering matters most; `--config.env.success_rate=0.333`
gives gymnasium's slip; `--config.rollout.shared_env_noise=true` gives a group's members the same
slips, as RAGEN's seeded envs do (no gain here, docs/results.md §15). RL gains only a few points
here (§13): the warm start's mistakes are mostly the same on every attempt, which leaves little
for group-relative sharpening (§16); a warm start fitted with `sft --name-holes` is much stronger
(0.655) but RL loses from it (§17)."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("FrozenLake", warm_start="builtin:frozenlake-tiny")
    c.env.success_rate = 0.8
    return c
