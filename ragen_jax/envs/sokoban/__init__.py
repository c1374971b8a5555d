"""Sokoban in pure JAX: gym-sokoban's board encoding (`board.py`), its procedural level
generator (`generator.py`) and its rules (`game.py`), made jittable, and the text the policy
reads (`text.py`); `Sokoban` joins the game and its text into one environment."""

from ragen_jax.envs.base import Environment
from ragen_jax.envs.sokoban.board import (
    LARGER_SOKOBAN,
    SIMPLE_SOKOBAN,
    SokobanParams,
    SokobanState,
)
from ragen_jax.envs.sokoban.game import SokobanGame, solve_level
from ragen_jax.envs.sokoban.generator import generate_level, generate_levels
from ragen_jax.envs.sokoban.text import SokobanText


class Sokoban(SokobanText, SokobanGame, Environment):
    """Sokoban as an environment: `SokobanGame`'s dynamics, `SokobanText`'s text."""


SOKOBAN = Sokoban()

__all__ = ["LARGER_SOKOBAN", "SIMPLE_SOKOBAN", "SOKOBAN", "Sokoban", "SokobanGame", "SokobanParams", "SokobanState",
           "SokobanText", "generate_level", "generate_levels", "solve_level"]
