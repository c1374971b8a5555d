"""A new game needs no edit outside its own code: a toy corridor, defined and registered here
with its text view, run-config options, solver and reasoning grader, goes through `registry.make`,
the run config, a validation rollout of the warm start's demonstrations (with board-reading
metrics), and the demo."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from ragen_jax.core.errors import ConfigError
from ragen_jax.envs import registry
from ragen_jax.envs.base import Environment
from ragen_jax.envs.game import is_valid_action

FLOOR, PLAYER, GOAL, PLAYER_ON_GOAL = range(4)  # symbol ids; PLAYER_ON_GOAL = PLAYER + GOAL


@struct.dataclass
class CorridorParams:
    length: int = struct.field(pytree_node=False, default=5)
    max_steps: int = struct.field(pytree_node=False, default=10)
    success_rate: float = struct.field(pytree_node=False, default=1.0)  # else the move goes the other way


@struct.dataclass
class CorridorState:
    player: jax.Array  # int32: the player's cell
    goal: jax.Array  # int32
    step_count: jax.Array
    done: jax.Array
    success: jax.Array


class Corridor(Environment):
    """Walk along a one-row corridor to the goal; a move may slip the other way."""

    name = "corridor"
    action_names = ("Left", "Right")
    symbols = ("_", "P", "G", "√")

    def default_params(self) -> CorridorParams:
        return CorridorParams()

    def reset(self, key, params):
        player, goal = jax.random.choice(key, params.length, (2,), replace=False).astype(jnp.int32)
        return CorridorState(player, goal, jnp.int32(0), jnp.bool_(False), jnp.bool_(False))

    def step(self, key, state, action, params):
        valid = is_valid_action(action, self.num_actions)
        slip = jnp.where(jax.random.uniform(key) < params.success_rate, 1, -1)
        moved = jnp.clip(state.player + jnp.where(action == 1, -1, 1) * slip, 0, params.length - 1)
        player = jnp.where(valid & ~state.done, moved, state.player)
        success = player == state.goal
        step_count = state.step_count + ~state.done
        done = state.done | success | (step_count >= params.max_steps)
        reward = jnp.where(success & ~state.done, 1.0, 0.0)
        info = {"success": success, "action_is_valid": valid, "action_is_effective": player != state.player,
                "truncated": done & ~success}
        return CorridorState(player, state.goal, step_count, done, success), reward, done, info

    def symbol_grid(self, state, params):
        cells = jnp.arange(params.length)
        grid = jnp.where(cells == state.goal, GOAL, FLOOR) + jnp.where(cells == state.player, PLAYER, FLOOR)
        return grid[None, :].astype(jnp.int32)

    def instructions(self) -> str:
        return "Walk along the corridor to the goal. The symbols are: _ floor, P player, G goal, √ player on goal."

    # the hooks the warm start, the demo and the ceilings call
    def solve(self, state, params, max_states=None):
        gap = int(state.goal) - int(state.player)
        return [2 if gap > 0 else 1] * abs(gap)

    def deterministic_params(self, params):
        return params.replace(success_rate=1.0)

    def demo_reasoning(self, state, params, moves, name_blocked=False) -> str:
        return f"Player {int(state.player)}, goal {int(state.goal)}. I move {' then '.join(moves)}."

    def grade_reasoning(self, state, params, reasoning):  # the board-reading metrics' hook
        said = re.search(r"Player (\d+)", reasoning)
        return {"player": (int(said.group(1)), int(said.group(1)) == int(state.player))} if said else {}


CORRIDOR = Corridor()
OPTIONS = {"max_steps": registry.Option(), "success_rate": registry.Option(kind=float, bounds=(0.0, 1.0))}


@pytest.fixture
def corridor(monkeypatch):
    """The corridor registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "ENVS", dict(registry.ENVS))
    monkeypatch.setattr(registry, "ALIASES", dict(registry.ALIASES))
    registry.register("Corridor", registry.Entry(CORRIDOR, CorridorParams(), options=OPTIONS), aliases=("corridor",))


def build(overrides):
    from ragen_jax.run import config as config_lib

    return config_lib.build(config_lib.apply_overrides(config_lib.default_config(), overrides), 1)


def test_make_and_the_run_config_take_its_options(corridor):
    env, params = registry.make("corridor", success_rate=0.5)
    assert env is CORRIDOR and params == CorridorParams(success_rate=0.5)
    run = build({"env.name": "Corridor", "env.success_rate": "0.75", "env.max_steps": "6"})
    assert run.env_overrides == {"success_rate": 0.75, "max_steps": 6}
    assert registry.make(run.env_name, **run.env_overrides)[1] == CorridorParams(max_steps=6, success_rate=0.75)
    for overrides, line in [
        ({"env.success_rate": "2"}, "env.success_rate=2.0 must be in [0, 1] (or None for the preset's)"),
        ({"env.data_path": "qa.jsonl"}, "env.data_path='qa.jsonl' is only used by MathQA, not Corridor "
                                        "(its options: max_steps, success_rate)"),
    ]:
        with pytest.raises(ConfigError) as err:
            build({"env.name": "Corridor", **overrides})
        assert str(err.value) == line
    with pytest.raises(ConfigError, match=r"env.success_rate=0.5 is only used by Corridor, FrozenLake, not "):
        build({"env.success_rate": "0.5"})


def test_registering_checks_the_name_and_the_options(corridor):
    entry = registry.Entry(CORRIDOR, CorridorParams())
    with pytest.raises(ValueError, match="environment name 'corridor' is taken"):
        registry.register("Corridor2", entry, aliases=("corridor",))
    entry = registry.Entry(CORRIDOR, CorridorParams(), options={"data_seed": registry.Option()})
    with pytest.raises(ValueError, match="option 'data_seed' names 'data_seed', not a keyword of make; allowed: "):
        registry.register("Corridor2", entry)


def test_a_validation_rollout_of_its_demonstrations_solves_every_level(corridor):
    """The warm start's demonstrations (the solver's moves, the game's reasoning) written by a
    scripted policy in the validation rollout: every level solved, every turn valid."""
    from agent_setup import scripted_texts, text_parts

    from ragen_jax.diagnostics import reasoning_check
    from ragen_jax.rollout.play import RolloutConfig
    from ragen_jax.rollout.policies import ScriptedPolicy
    from ragen_jax.training import sft
    from ragen_jax.training.validation import EvalConfig, validation_rollout

    env, params, tok, codec, prompt = text_parts("Corridor", 2, success_rate=0.5)
    params = sft.deterministic(env, params)
    train = RolloutConfig(num_groups=6, group_size=1, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4,
                          max_new_tokens=32)
    eval_config = EvalConfig(num_envs=6)
    config = eval_config.rollout_config(train)
    states = eval_config.start_states(env, params, train)
    texts = sft.demonstration_texts(env, params, states, config, np.random.default_rng(0), noise=0.0)
    assert texts[0][0].startswith(f" Player {int(states.player[0])}, goal {int(states.goal[0])}. I move ")
    tokens, lengths = scripted_texts(tok, texts, config)
    metrics, traj = jax.jit(lambda tk, ln: validation_rollout(lambda part: ScriptedPolicy(tk, ln), env, params,
                                                              codec, prompt, eval_config, train))(tokens, lengths)
    assert float(metrics["success"]) == 1.0 and float(metrics["valid_action_rate"]) == 1.0
    # its board-reading metrics come from its hook, graded on the states each turn was shown
    reading = reasoning_check.validation_metrics(jax.device_get(traj), tok, env, params)
    assert reading["reasoning/player_stated"] == 1.0 and reading["reasoning/player_right"] == 1.0


def test_the_demo_plays_it(corridor, capsys):
    from ragen_jax.envs.demo import main as demo_main

    assert demo_main(["--env", "corridor", "--levels", "1"]) == 0
    out = capsys.readouterr().out
    assert "--- corridor level 0" in out and "optimal solution" in out
    assert out.splitlines()[-1].endswith(", success")


def test_the_warm_start_and_the_ceilings_ask_the_game(corridor):
    """What needs a solver says so in one line; the ceiling of any game with one is its solver's."""
    from ragen_jax.analysis import ceilings
    from ragen_jax.envs.countdown import COUNTDOWN
    from ragen_jax.training import sft

    assert CORRIDOR.has_solver and not COUNTDOWN.has_solver
    sft.check_env(CORRIDOR, sft.SFTConfig())
    with pytest.raises(ValueError, match=r"^--name-blocked: .*FrozenLake \(holes\).* only, not env corridor$"):
        sft.check_env(CORRIDOR, sft.SFTConfig(name_blocked=True))
    with pytest.raises(ValueError, match=r"^env Countdown has no solver: the supervised warm start needs one$"):
        sft.check_env(COUNTDOWN, sft.SFTConfig())
    state = CorridorState(np.int32(0), np.int32(3), np.int32(0), np.bool_(False), np.bool_(False))
    assert ceilings.solvable(CORRIDOR, state, CorridorParams(), budget=3)
    assert not ceilings.solvable(CORRIDOR, state, CorridorParams(), budget=2)
