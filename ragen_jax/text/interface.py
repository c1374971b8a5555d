"""What the text layer takes from a game: the declared interface of `TextCodec.build` and
`PromptTemplate.build`.

The games (`ragen_jax.envs`) sit above this package and import it; the text layer never imports
a game. It reads a game only through `GameText`, which every environment's text view
(`ragen_jax.envs.text_view.TextView`) provides; a test checks each registered game against it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GameText(Protocol):
    """A game as the codec and the prompt see it."""

    symbols: tuple[str, ...]  # symbol id -> the text drawn for that board cell (board games)
    action_names: tuple[str, ...]  # action k (1-based) is action_names[k - 1]
    answer_kind: str  # "actions": the answer names actions; "text": the game reads it

    def instructions(self) -> str:
        """The rules and symbol legend for the system prompt."""

    def boundary_samples(self) -> list[str]:
        """State texts whose tokens must start and end at pre-token boundaries in the prompt."""

    def text_tables(self, tokenizer, params: Any = None) -> dict:
        """Host-built token tables the game's in-graph text needs (`TextCodec.env_tables`)."""
