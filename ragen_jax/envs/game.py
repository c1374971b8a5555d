"""The game interface: the dynamics of an environment, with no text.

A game object holds no state: `reset` and `step` are pure functions of pytrees (gymnax
style), so they jit, vmap and live inside one XLA graph with the model. Parameters are a
frozen, hashable dataclass whose fields are static (they fix array shapes).

Conventions shared by all games:
- actions are int32 1..len(action_names); anything else is an invalid action, a no-op
  that still counts as a step (gym-sokoban's action 0);
- stepping a finished episode changes nothing and returns reward 0 and done=True;
- `info` carries `success`, `action_is_valid`, `action_is_effective` and `truncated`;
- `symbol_grid(state, params)` gives the board as an int32 grid of symbol ids, the form a
  text view draws it from (`ragen_jax.envs.text_view`).

Host-side hooks for what is built on a game (the supervised warm start's demonstrations, the
demo, the task ceilings), so no caller asks which game it has: `solve` (a shortest plan from
a state; a game without a solver keeps the default and `has_solver` is False) and
`deterministic_params` (the parameters with the dynamics' randomness switched off).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Info = dict[str, jax.Array]
SOLVER_STATES = 2_000_000  # the default bound on the states a solver's search may visit


class Game:
    """Base class of the dynamics; subclasses set the class attributes and implement the methods."""

    name: str = ""
    action_names: tuple[str, ...] = ()  # action k (1-based) is action_names[k - 1]

    @property
    def num_actions(self) -> int:
        return len(self.action_names)

    def default_params(self) -> Any:
        raise NotImplementedError

    def reset(self, key: jax.Array, params: Any) -> Any:
        raise NotImplementedError

    def reset_batch(self, keys: jax.Array, params: Any) -> Any:
        """A batch of fresh episodes, one per key (games may do better than vmap)."""
        return jax.vmap(self.reset, in_axes=(0, None))(keys, params)

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        """(state, reward f32, done bool, info) after `action` (int32, 1-based)."""
        raise NotImplementedError

    def symbol_grid(self, state: Any, params: Any) -> jax.Array:
        raise NotImplementedError

    def solve(self, state: Any, params: Any, max_states: int = SOLVER_STATES) -> list[int] | None:
        """Host-side: a shortest action sequence (1-based) from `state`, one episode's host arrays,
        to success as if the dynamics were deterministic; [] when already solved, None when
        unsolvable or when the search would visit more than `max_states` states."""
        raise NotImplementedError(f"env {self.name} has no solver")

    @property
    def has_solver(self) -> bool:
        """Whether the game defines `solve`."""
        return type(self).solve is not Game.solve

    def deterministic_params(self, params: Any) -> Any:
        """`params` with any randomness of the dynamics switched off (a slip, say), so a plan made on
        the host plays out as planned; unchanged for a deterministic game."""
        return params


def require_solver(game: Game, needed_by: str) -> None:
    """One clear line when `game` has no solver and `needed_by` (e.g. "the supervised warm start") needs one."""
    if not game.has_solver:
        raise ValueError(f"env {game.name} has no solver: {needed_by} needs one")


def keep_where(rows: jax.Array, new: Any, old: Any) -> Any:
    """`new` in the rows where `rows` (bool[B]) is set, `old` elsewhere, leaf by leaf."""
    return jax.tree.map(lambda n, o: jnp.where(rows.reshape(rows.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def is_valid_action(action: jax.Array, num_actions: int) -> jax.Array:
    return (action >= 1) & (action <= num_actions)
