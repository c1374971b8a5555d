"""The text view: what the policy reads and writes, for a game (`ragen_jax.envs.game`).

A text view holds no dynamics of its own: it is combined with a game in one class
(`ragen_jax.envs.base.Environment`) and calls the game's `step`, `symbol_grid` and `name`.

A state becomes tokens: the rollout shows the policy `state_tokens(state, params, codec)`, the
state's text followed by a newline as token ids. For a board game that is the codec's board
pieces, the symbols of `symbol_grid` (`symbols` says how each is written); a view with other
text overrides it and builds the token tables it needs on the host once
(`text_tables(tokenizer)`, kept in `TextCodec.env_tables`). `render_text` is the same text on
the host.

An answer becomes steps: the rollout hands every answer to the view through one hook,
`read_answer` (per row) then `play_answers` (batched). Two kinds of answer (`answer_kind`):
"actions" (Sokoban, FrozenLake): the answer is parsed into action ids and `step` runs once per
action. "text" (Countdown, QA, `TextAnswerView`): the game reads the answer itself, `step_text`
with the bytes of the `<answer>` group.

A demonstration's reasoning is the view's too: `demo_reasoning` says, from the state, what the
supervised warm start's templated reasoning before a planned move says (`blocked_kind`: it
can also name the moves the cells next to the player block, FrozenLake's holes or Sokoban's walls),
and `grade_reasoning` checks what a generated reasoning states against the state it was shown
(the arrays, not the rendered text): the board-reading metrics of validation and evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.coordinates import coordinate_tables, coordinate_tokens, format_cells, render_format
from ragen_jax.envs.game import keep_where
from ragen_jax.text.codec import answer_text, parse_answer


class AnswerSteps(NamedTuple):
    """What a batch of answers did to a batch of episodes (`TextView.play_answers`)."""

    states: Any
    reward: jax.Array  # f32[B] env rewards of the steps taken
    taken: jax.Array  # int32[B] actions taken in each episode so far
    valid: jax.Array  # bool[B] the answer was well formed (False: the rollout's format penalty)
    actions: jax.Array  # int32[B, max_actions_per_turn] the parsed actions (0: none; text answers: all 0)


class TextView:
    """Base class of the text view; subclasses set the class attributes and implement the methods."""

    symbols: tuple[str, ...] = ()  # symbol id -> the text drawn for that cell
    render_formats: tuple[str, ...] = ("grid",)  # `render_text` formats this view offers
    answer_kind: str = "actions"  # "actions": named actions, parsed by the codec; "text": TextAnswerView
    max_answer_bytes: int = 0  # "text" views: the longest answer group `step_text` reads
    # what `demo_reasoning` can name next to the player, the moves into it: "holes" (FrozenLake), "walls" (Sokoban)
    blocked_kind: str | None = None

    def step_text(self, key: jax.Array, state: Any, answer: jax.Array, length: jax.Array, params: Any,
                  tables: dict):
        """`answer_kind == "text"`: step with the answer's bytes (uint8[max_answer_bytes], valid
        up to `length`) and the view's `text_tables`. `info["action_is_valid"]` False means a
        malformed answer: the rollout applies the format penalty and keeps the old state."""
        raise NotImplementedError

    def read_answer(self, codec, text: jax.Array, length: jax.Array):
        """One generation's answer, from its bytes (uint8[n], valid up to `length`), in the form
        `play_answers` takes: (actions int32[M], count, format_ok) by the codec's answer parser."""
        return parse_answer(codec, text, length)

    def play_answers(self, answers, states: Any, active: jax.Array, taken: jax.Array,
                     step_keys: Callable[[int, jax.Array], jax.Array], params: Any, codec,
                     max_actions_per_turn: int, max_actions: int) -> AnswerSteps:
        """Step a batch of episodes with their answers (`read_answer`'s, batched): each parsed
        action in order while the row is `active`, its answer well formed, its episode running
        and fewer than `max_actions` actions taken. `step_keys(k, taken)`: the env keys [B] of
        every row's k-th action this turn, the `taken`-th of its episode."""
        actions, num_parsed, format_ok = answers
        step = jax.vmap(self.step, in_axes=(0, 0, 0, None))
        reward = jnp.zeros(taken.shape[0], jnp.float32)
        for k in range(max_actions_per_turn):
            go = active & format_ok & (k < num_parsed) & ~states.done & (taken < max_actions)
            stepped, r, _, _ = step(step_keys(k, taken), states, actions[:, k], params)
            states = keep_where(go, stepped, states)
            reward = reward + jnp.where(go, r, 0.0)
            taken = taken + go
        return AnswerSteps(states, reward, taken, format_ok, actions)

    def text_tables(self, tokenizer, params: Any = None) -> dict:
        """Host-built arrays (token ids of text pieces, datasets) `state_tokens` and `step_text`
        read in the graph; they travel in `TextCodec.env_tables`. For the board games, the
        coordinate lines' pieces when `params` ask for "grid_coord"; none for the plain grid."""
        if params is None or render_format(params) == "grid":
            return {}
        return coordinate_tables(tokenizer, self.board_shape(params), self.coordinate_labels, self.symbols)

    def state_tokens(self, state: Any, params: Any, codec) -> tuple[jax.Array, jax.Array]:
        """The state's text followed by a newline, as token ids: (ids int32[n], mask), valid
        first, n static. Equals `tokenizer.encode(render_text(state, params) + "\n")`: the
        grid, after the coordinate lines when the params' `render_format` is "grid_coord"."""
        from ragen_jax.text.codec import pack, render_observation

        grid = render_observation(codec, self.symbol_grid(state, params), final_newline=True)
        if render_format(params) == "grid":
            return grid
        lines = self.coordinate_tokens(state, params, codec.env_tables)
        return pack(*(jnp.concatenate(parts) for parts in zip(lines, grid)))

    def coordinate_tokens(self, state: Any, params: Any, tables: dict) -> tuple[jax.Array, jax.Array]:
        """The `grid_coord` lines' token ids in the graph: (ids, valid), holes anywhere."""
        if "coord_items" not in tables:
            raise ValueError(f"render_format='grid_coord' needs the codec built with these env params "
                             f"(TextCodec.build(..., env_params=params)) for {self.name}")
        return coordinate_tokens(self.coordinate_cells(state, params), self.board_shape(params)[1], tables)

    def boundary_samples(self) -> list[str]:
        """State texts the prompt builder tokenizes in context to check that the state's tokens
        start and end at pre-token boundaries (every symbol at the board's start and end)."""
        samples = [f"{s} {s}" for s in self.symbols]
        if "grid_coord" in self.render_formats:  # the coordinate lines come first, after "State:\n"
            samples += [f"Board size: 2 rows x 2 cols\n{self.coordinate_labels[0]}: none\n{samples[0]}"]
        return samples

    def instructions(self) -> str:
        """The rules and symbol legend for the system prompt (the prompt lists the actions itself)."""
        raise NotImplementedError

    def render_grid(self, state: Any, params: Any) -> str:
        """Host-side text of the board: cells separated by spaces, rows by newlines.

        Space-separated cells make every cell its own pre-token under Qwen2's
        pre-tokenizer, which is what lets the in-graph codec reproduce
        `tokenizer.encode(text)` piece by piece (docs/architecture.md#text-in-the-graph).
        """
        grid = np.asarray(jax.device_get(self.symbol_grid(state, params)))
        return "\n".join(" ".join(self.symbols[int(s)] for s in row) for row in grid)

    def render_text(self, state: Any, params: Any, fmt: str | None = None) -> str:
        """The board as the agent reads it: `grid`, or `grid_coord` (coordinate lines, then grid);
        by default the params' `render_format`."""
        fmt = render_format(params) if fmt is None else fmt
        if fmt not in self.render_formats:
            raise ValueError(f"render format {fmt!r} is not supported by {self.name}; allowed: {self.render_formats}")
        grid = self.render_grid(state, params)
        if fmt == "grid":
            return grid
        return "\n".join(self.coordinate_lines(state, params)) + "\n" + grid

    # views that offer "grid_coord" define the lines' labels and, per label, the cells it lists
    coordinate_labels: tuple[str, ...] = ()

    def coordinate_cells(self, state: Any, params: Any) -> list[tuple[jax.Array, int]]:
        """Per `coordinate_labels` entry: (bool[R, C] of the cells its line lists, row-major, the
        most cells it can list). Array code, so the host lines and the graph's tokens agree."""
        raise NotImplementedError

    def board_shape(self, params: Any) -> tuple[int, int]:
        """(rows, cols) of `symbol_grid` under `params` ("grid_coord" views)."""
        raise NotImplementedError

    def coordinate_lines(self, state: Any, params: Any) -> list[str]:
        """The `grid_coord` header lines: the board's size, then each label's cells ("none": no cell)."""
        rows, cols = self.board_shape(params)
        lists = [format_cells(np.asarray(mask)) or "none" for mask, _ in self.coordinate_cells(state, params)]
        return [f"Board size: {rows} rows x {cols} cols"] + [f"{label}: {cells}" for label, cells in
                                                             zip(self.coordinate_labels, lists)]

    def demo_reasoning(self, state: Any, params: Any, moves: list[str], name_blocked: bool = False) -> str:
        """The warm start's reasoning before `moves` (action names) from `state` (host arrays):
        templated but grounded in the state, so the fitted policy starts by reading the board.
        `name_blocked` (views with a `blocked_kind`): also the moves into such cells."""
        return f"I move {' then '.join(moves)}."

    def grade_reasoning(self, state: Any, params: Any, reasoning: str) -> dict[str, tuple[Hashable, bool]]:
        """What one turn's reasoning states about the state it was shown (host arrays of one
        row), each fact checked against the state: {fact: (what it said, right)} for the facts
        it states, e.g. {"player": ((2, 3), True)}. Validation reports, per fact, the share of
        turns stating it, the share of those right and the share naming the most named value
        (`diagnostics.reasoning_check`). {}: no board facts to check (free-text games)."""
        return {}

    def grade_template(self, reasoning: str, player, blocked=None) -> dict[str, tuple[Hashable, bool]]:
        """`grade_reasoning` for the board games' template (`demo_reasoning`: "Player (r, c), …,
        walls: Up, Right. I move …"): the stated cell against `player` (row, col), and the named
        moves into a `blocked_kind` cell against the bool grid `blocked` (None: not graded)."""
        facts = {}
        player = tuple(int(x) for x in player)
        cell = STATED_CELL.search(reasoning)
        if cell:
            said = (int(cell.group(1)), int(cell.group(2)))
            facts["player"] = (said, said == player)
        named = STATED_BLOCKED.search(reasoning)
        if blocked is not None and named and named.group(1) == self.blocked_kind:
            said = frozenset(m.strip() for m in named.group(2).split(",")) - {"none"}
            facts[self.blocked_kind] = (said, said == set(moves_into(blocked, player, self.action_names)))
        return facts


STATED_CELL = re.compile(r"Player \((\d+), (\d+)\)")  # the template's player cell
STATED_BLOCKED = re.compile(r"(holes|walls): ([A-Za-z, ]*?)\.")  # the template's moves into holes or walls


class TextAnswerView(TextView):
    """The view of a game that reads its answer as text (Countdown, QA): one `step_text` per
    answer, with the bytes of the `<answer>` group; a readable answer counts as one action."""

    answer_kind = "text"

    def read_answer(self, codec, text: jax.Array, length: jax.Array):
        """(answer bytes uint8[max_answer_bytes], length, matched): the `<answer>` group's text."""
        return answer_text(text, length, self.max_answer_bytes)

    def play_answers(self, answers, states, active, taken, step_keys, params, codec, max_actions_per_turn,
                     max_actions) -> AnswerSteps:
        """One `step_text` per row; the answer is valid when it matched the answer format and
        the game could read it (`info["action_is_valid"]`)."""
        answer, answer_len, matched = answers
        step_text = jax.vmap(self.step_text, in_axes=(0, 0, 0, 0, None, None))
        stepped, r, _, info = step_text(step_keys(0, taken), states, answer, answer_len, params, codec.env_tables)
        valid = matched & info["action_is_valid"]
        go = active & valid & ~states.done & (taken < max_actions)
        states = keep_where(go, stepped, states)
        actions = jnp.zeros((taken.shape[0], max_actions_per_turn), jnp.int32)
        return AnswerSteps(states, jnp.where(go, r, 0.0), taken + go, valid, actions)


DIRECTIONS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}  # (row, col) steps


def moves_into(blocked, cell, names=tuple(DIRECTIONS)) -> list[str]:
    """Host-side: which of the moves `names` (in that order) go from `cell` straight into a true
    cell of the bool grid `blocked`: what a reasoning naming the holes or walls names."""
    blocked = np.asarray(blocked, bool)
    r, c = (int(x) for x in cell)
    steps = [(name, DIRECTIONS[name]) for name in names]
    return [name for name, (dr, dc) in steps
            if 0 <= r + dr < blocked.shape[0] and 0 <= c + dc < blocked.shape[1] and blocked[r + dr, c + dc]]
