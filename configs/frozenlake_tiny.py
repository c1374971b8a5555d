"""The CPU default on FrozenLake (4×4, slippery: success_rate 1/3), same sizes as
sokoban_tiny.py except 5 turns (budget 10 moves, the paper's FrozenLake setting): with 3 turns
the slip leaves the best possible policy only 0.33 success on the validation levels, with 5 it
is 0.48 (`python benchmarks/reproduce.py ceiling --env frozenlake`). Slip makes rewards
stochastic, where reward-variance filtering matters most."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("FrozenLake", warm_start="builtin:frozenlake-tiny")
    c.rollout.update(max_turns=5, max_actions_per_traj=10)
    return c
