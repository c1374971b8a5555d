"""The functional environment interface every ragen_jax environment follows.

An environment object holds no state: `reset` and `step` are pure functions of pytrees
(gymnax style), so they jit, vmap and live inside one XLA graph with the model. Parameters
are a frozen, hashable dataclass whose fields are static (they fix array shapes).

Conventions shared by all environments:
- actions are int32 1..len(action_names); anything else is an invalid action, a no-op
  that still counts as a step (gym-sokoban's action 0);
- stepping a finished episode changes nothing and returns reward 0 and done=True;
- `info` carries `success`, `action_is_valid`, `action_is_effective` and `truncated`;
- `symbol_grid(state, params)` gives the int32 grid of symbol ids that both the host-side
  `render_text` and the in-graph text codec render from `symbols`.

Two kinds of answer (`answer_kind`). "actions" (Sokoban, FrozenLake): the rollout parses the
answer into action ids and calls `step` once per action. "text" (Countdown, QA): the env
reads the answer itself; the rollout calls `step_text` with the bytes of the `<answer>` group.
The state is shown to the policy as token ids from `state_tokens`: for the board games the
codec's board pieces; an env with other text overrides it and builds the token tables it
needs on the host once (`text_tables(tokenizer)`, kept in `TextCodec.env_tables`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

Info = dict[str, jax.Array]


class Environment:
    """Base class; subclasses set the class attributes and implement the methods."""

    name: str = ""
    action_names: tuple[str, ...] = ()  # action k (1-based) is action_names[k - 1]
    symbols: tuple[str, ...] = ()  # symbol id -> the text drawn for that cell
    render_formats: tuple[str, ...] = ("grid",)  # `render_text` formats this env offers
    answer_kind: str = "actions"  # "actions": named actions, parsed by the codec; "text": see step_text
    max_answer_bytes: int = 0  # "text" envs: the longest answer group `step_text` reads

    def default_params(self) -> Any:
        raise NotImplementedError

    def reset(self, key: jax.Array, params: Any) -> Any:
        raise NotImplementedError

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        raise NotImplementedError

    def reset_batch(self, keys: jax.Array, params: Any) -> Any:
        """A batch of fresh episodes, one per key (environments may do better than vmap)."""
        return jax.vmap(self.reset, in_axes=(0, None))(keys, params)

    def step_text(self, key: jax.Array, state: Any, answer: jax.Array, length: jax.Array, params: Any,
                  tables: dict):
        """`answer_kind == "text"`: step with the answer's bytes (uint8[max_answer_bytes], valid
        up to `length`) and the env's `text_tables`. `info["action_is_valid"]` False means a
        malformed answer: the rollout applies the format penalty and keeps the old state."""
        raise NotImplementedError

    def symbol_grid(self, state: Any, params: Any) -> jax.Array:
        raise NotImplementedError

    def text_tables(self, tokenizer) -> dict:
        """Host-built arrays (token ids of text pieces, datasets) `state_tokens` and `step_text`
        read in the graph; they travel in `TextCodec.env_tables`. None for the board games."""
        return {}

    def state_tokens(self, state: Any, params: Any, codec) -> tuple[jax.Array, jax.Array]:
        """The state's text followed by a newline, as token ids: (ids int32[n], mask), valid
        first, n static. Equals `tokenizer.encode(render_text(state, params) + "\n")`."""
        from ragen_jax.text.codec import render_observation

        return render_observation(codec, self.symbol_grid(state, params), final_newline=True)

    def boundary_samples(self) -> list[str]:
        """State texts the prompt builder tokenizes in context to check that the state's tokens
        start and end at pre-token boundaries (every symbol at the board's start and end)."""
        return [f"{s} {s}" for s in self.symbols]

    def instructions(self) -> str:
        """The rules and symbol legend for the system prompt (the prompt lists the actions itself)."""
        raise NotImplementedError

    @property
    def num_actions(self) -> int:
        return len(self.action_names)

    def render_grid(self, state: Any, params: Any) -> str:
        """Host-side text of the board: cells separated by spaces, rows by newlines.

        Space-separated cells make every cell its own pre-token under Qwen2's
        pre-tokenizer, which is what lets the in-graph codec reproduce
        `tokenizer.encode(text)` piece by piece (docs/architecture.md#text-in-the-graph).
        """
        grid = np.asarray(jax.device_get(self.symbol_grid(state, params)))
        return "\n".join(" ".join(self.symbols[int(s)] for s in row) for row in grid)

    def render_text(self, state: Any, params: Any, fmt: str = "grid") -> str:
        """The board as the agent reads it: `grid`, or `grid_coord` (coordinate lines, then grid)."""
        if fmt not in self.render_formats:
            raise ValueError(f"render format {fmt!r} is not supported by {self.name}; allowed: {self.render_formats}")
        grid = self.render_grid(state, params)
        if fmt == "grid":
            return grid
        return "\n".join(self.coordinate_lines(state, params)) + "\n" + grid

    def coordinate_lines(self, state: Any, params: Any) -> list[str]:
        """The `grid_coord` header lines (environments that offer that format define them)."""
        raise NotImplementedError


def format_cells(mask) -> str:
    """`(row, col)` of every true cell, 0-based, comma-separated (the `grid_coord` lists)."""
    return ", ".join(f"({r}, {c})" for r, c in zip(*np.nonzero(np.asarray(mask))))


def is_valid_action(action: jax.Array, num_actions: int) -> jax.Array:
    return (action >= 1) & (action <= num_actions)

