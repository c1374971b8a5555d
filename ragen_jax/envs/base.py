"""The environment interface: a game (`game.py`) and its text view (`text_view.py`) in one class.

The rollout, the train step and the codec take an `Environment`: `reset`, `step`,
`symbol_grid` and the rest of the dynamics come from `Game`; `state_tokens`, `read_answer`,
`play_answers`, `render_text` and the rest of the text from `TextView`. A board game defines
the two apart (`sokoban/`, `frozenlake/`: `game.py` and `text.py`) and joins them in its
package as `class Name(NameText, NameGame, Environment)`. A game whose move is a text answer
(Countdown, QA) is a `TextAnswerEnvironment`, one class in one file: there the answer text is
the move, so the reading is the game.
"""

from ragen_jax.envs.game import Game, Info, is_valid_action, keep_where
from ragen_jax.envs.coordinates import format_cells
from ragen_jax.envs.text_view import AnswerSteps, TextAnswerView, TextView

__all__ = ["AnswerSteps", "Environment", "Game", "Info", "TextAnswerEnvironment", "TextAnswerView", "TextView",
           "format_cells", "is_valid_action", "keep_where"]


class Environment(TextView, Game):
    """A game together with the text the policy reads and writes for it."""


class TextAnswerEnvironment(TextAnswerView, Environment):
    """A game played by text answers (Countdown, QA): `step_text` reads the answer and moves."""
