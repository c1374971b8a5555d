"""Sokoban in pure JAX: gym-sokoban's rules (`game.py`) and its procedural level generator
(`generator.py`), made jittable, on gym-sokoban's board encoding (`board.py`)."""

from ragen_jax.envs.sokoban.board import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SokobanParams, SokobanState
from ragen_jax.envs.sokoban.game import SOKOBAN, Sokoban
from ragen_jax.envs.sokoban.generator import generate_level, generate_levels

__all__ = ["LARGER_SOKOBAN", "SIMPLE_SOKOBAN", "SOKOBAN", "Sokoban", "SokobanParams", "SokobanState", "generate_level",
           "generate_levels"]
