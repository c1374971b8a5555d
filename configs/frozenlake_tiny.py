"""The CPU default on FrozenLake (4×4, slippery: success_rate 1/3), same sizes as
sokoban_tiny.py. Slip makes rewards stochastic, where reward-variance filtering matters most."""

from ragen_jax.config import tiny_cpu_config


def get_config():
    return tiny_cpu_config("FrozenLake", warm_start="builtin:frozenlake-tiny")
