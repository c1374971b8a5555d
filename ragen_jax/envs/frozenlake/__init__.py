"""FrozenLake in pure JAX (`game.py`)."""

from ragen_jax.envs.frozenlake.game import (FROZENLAKE, FrozenLake, FrozenLakeParams, FrozenLakeState, generate_map,
                                            moves_into_holes, reachable, sample_map)

__all__ = ["FROZENLAKE", "FrozenLake", "FrozenLakeParams", "FrozenLakeState", "generate_map", "moves_into_holes",
           "reachable", "sample_map"]
