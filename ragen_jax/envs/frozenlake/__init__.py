"""FrozenLake in pure JAX: gymnasium's slippery-ice rules (`game.py`) on maps generated inside
jit (`maps.py`), and the text the policy reads (`text.py`); `FrozenLake` joins the game and its
text into one environment."""

from ragen_jax.envs.base import Environment
from ragen_jax.envs.frozenlake.game import (
    GOAL,
    HOLE,
    MOVES,
    PLAYER,
    PLAYER_IN_HOLE,
    PLAYER_ON_GOAL,
    FROZEN,
    FrozenLakeGame,
)
from ragen_jax.envs.frozenlake.maps import (
    DESC_LETTERS,
    FrozenLakeParams,
    FrozenLakeState,
    generate_map,
    reachable,
    sample_map,
)
from ragen_jax.envs.frozenlake.text import FrozenLakeText


class FrozenLake(FrozenLakeText, FrozenLakeGame, Environment):
    """FrozenLake as an environment: `FrozenLakeGame`'s dynamics, `FrozenLakeText`'s text."""


FROZENLAKE = FrozenLake()

__all__ = ["DESC_LETTERS", "FROZEN", "FROZENLAKE", "GOAL", "HOLE", "MOVES", "PLAYER", "PLAYER_IN_HOLE", "PLAYER_ON_GOAL",
           "FrozenLake", "FrozenLakeGame", "FrozenLakeParams", "FrozenLakeState", "FrozenLakeText", "generate_map",
           "reachable", "sample_map"]
