"""A board game's dynamics and its text view apart (`Game`, `TextView`) and joined
(`Environment`): each half has none of the other's members, and the game alone plays exactly
as the environment does."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.envs.base import Environment, TextAnswerEnvironment
from ragen_jax.envs.countdown import COUNTDOWN
from ragen_jax.envs.frozenlake import (
    FROZENLAKE,
    FrozenLakeGame,
    FrozenLakeParams,
    FrozenLakeText,
)
from ragen_jax.envs.game import Game
from ragen_jax.envs.sokoban import SIMPLE_SOKOBAN, SOKOBAN, SokobanGame, SokobanText
from ragen_jax.envs.text_view import TextAnswerView, TextView

# (environment, its game class, its text class, parameters small enough to play quickly)
BOARD_GAMES = {
    "sokoban": (SOKOBAN, SokobanGame, SokobanText, SIMPLE_SOKOBAN),
    "frozenlake": (FROZENLAKE, FrozenLakeGame, FrozenLakeText, FrozenLakeParams(size=4, max_steps=6)),
}
TEXT_MEMBERS = ("symbols", "render_formats", "answer_kind", "max_answer_bytes", "blocked_kind", "step_text",
                "read_answer", "play_answers", "text_tables", "state_tokens", "boundary_samples", "instructions",
                "render_grid", "render_text", "coordinate_labels", "coordinate_cells", "coordinate_tokens",
                "coordinate_lines", "board_shape", "demo_reasoning", "grade_reasoning", "grade_template")
GAME_MEMBERS = ("name", "action_names", "num_actions", "default_params", "reset", "reset_batch", "step",
                "symbol_grid", "solve", "has_solver", "deterministic_params")


def public_members(cls) -> set[str]:
    """The public names `cls` defines or inherits, `object`'s left out."""
    return {name for name in dir(cls) if not name.startswith("_")} - set(dir(object))


def test_the_base_classes_split_the_interface():
    assert public_members(Game) == set(GAME_MEMBERS)
    assert public_members(TextView) == set(TEXT_MEMBERS)
    assert public_members(Environment) == set(GAME_MEMBERS) | set(TEXT_MEMBERS)
    assert Environment.__mro__ == (Environment, TextView, Game, object)
    assert TextAnswerEnvironment.__mro__ == (TextAnswerEnvironment, TextAnswerView, Environment, TextView, Game,
                                             object)


@pytest.mark.parametrize("name", BOARD_GAMES)
def test_the_game_alone_has_no_text(name):
    _, game_cls, _, _ = BOARD_GAMES[name]
    game = game_cls()
    assert not isinstance(game, TextView)
    for member in ("symbols", "state_tokens", "instructions", "render_text", "coordinate_lines", "read_answer"):
        assert not hasattr(game, member), member
    assert not public_members(game_cls) & set(TEXT_MEMBERS)


@pytest.mark.parametrize("name", BOARD_GAMES)
def test_the_text_view_alone_has_no_dynamics(name):
    _, _, text_cls, _ = BOARD_GAMES[name]
    text = text_cls()
    assert not isinstance(text, Game)
    for member in ("reset", "step", "symbol_grid", "action_names", "name"):
        assert not hasattr(text, member), member


@pytest.mark.parametrize("name", BOARD_GAMES)
def test_the_environment_is_the_game_and_its_text(name):
    env, game_cls, text_cls, _ = BOARD_GAMES[name]
    assert type(env).__mro__[1:] == (text_cls, game_cls, Environment, TextView, Game, object)
    assert isinstance(env, Environment)
    assert public_members(type(env)) == public_members(game_cls) | public_members(text_cls)
    # Each member comes from the half that defines it: no half overrides the other.
    for member in public_members(game_cls) - set(GAME_MEMBERS) - set(TEXT_MEMBERS):  # e.g. state_from_rooms
        assert inspect.getattr_static(env, member) is inspect.getattr_static(game_cls, member)
    for member in GAME_MEMBERS:
        assert inspect.getattr_static(env, member) is inspect.getattr_static(game_cls, member), member
    for member in TEXT_MEMBERS:
        assert inspect.getattr_static(env, member) is inspect.getattr_static(text_cls, member), member


def test_a_text_answer_environment_is_an_environment():
    assert isinstance(COUNTDOWN, TextAnswerEnvironment) and isinstance(COUNTDOWN, Environment)
    assert COUNTDOWN.answer_kind == "text"


ACTIONS = (1, 2, 3, 4, 0, 4, 3, 2)  # every action, an invalid one, and on past a FrozenLake episode's end


@jax.jit(static_argnums=(0, 2))
def play(game, keys, params):
    """Fresh episodes both ways (`reset_batch`, `reset` per key), then ACTIONS from the latter:
    the states, rewards, dones, infos and symbol grids of every step."""
    batch, starts = game.reset_batch(keys, params), jax.vmap(game.reset, in_axes=(0, None))(keys, params)

    def one_step(states, xs):
        t, action = xs
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, t)
        out = jax.vmap(game.step, in_axes=(0, 0, None, None))(step_keys, states, action, params)
        return out[0], (out, jax.vmap(game.symbol_grid, in_axes=(0, None))(out[0], params))

    _, steps = jax.lax.scan(one_step, starts, (jnp.arange(len(ACTIONS)), jnp.asarray(ACTIONS, jnp.int32)))
    return batch, starts, steps


@pytest.mark.parametrize("name", BOARD_GAMES)
def test_the_game_alone_plays_as_the_environment(name):
    env, game_cls, _, params = BOARD_GAMES[name]
    keys = jax.random.split(jax.random.key(11), 3)
    played, expected = play(game_cls(), keys, params), play(env, keys, params)
    assert jax.tree.structure(played) == jax.tree.structure(expected)
    for x, y in zip(jax.tree.leaves(played), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_every_registered_game_gives_the_text_layer_its_declared_interface():
    """`TextCodec.build` and `PromptTemplate.build` read a game only through `GameText`."""
    from ragen_jax.envs import registry
    from ragen_jax.text.interface import GameText

    for name in sorted(registry.ENVS):
        entry = registry.entry(name)
        env = entry.env if entry.env is not None else registry.make(name)[0]
        assert isinstance(env, GameText), name
    assert not isinstance(SokobanGame(), GameText)  # the dynamics alone have no text

