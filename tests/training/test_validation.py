"""Validation rollouts: metrics against NumPy, fixed seeds, pass@k, readable trajectories."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.envs.solver import solve_sokoban
from ragen_jax.models import sampling
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rollout.layout import BufferLayout
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.rollout.render import render_trajectories
from ragen_jax.training.validation import EvalConfig, Validator, validate, validation_rollout

from agent_setup import TEST_LAYERS, ScriptedPolicy, text_parts

TRAIN = RolloutConfig(num_groups=5, group_size=3, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4,
                      max_new_tokens=16, sampling=sampling.SamplingParams(temperature=1.0, top_p=0.9))
EVAL = EvalConfig(num_envs=3, samples_per_env=2, seed=7)
SCRIPTED_EVAL = EvalConfig(num_envs=3, samples_per_env=2, seed=4)  # solver plans of 5, 1 and 3 actions
DECODE = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def setup():
    return text_parts("SimpleSokoban", TRAIN.max_actions_per_turn)


@pytest.fixture(scope="module")
def levels(setup):
    """levels(eval_config) -> the host state of every row, rebuilt here from the seed alone:
    level g is reset(split(split(key(seed))[0], num_envs)[g]), shared by its samples."""
    env, params, *_ = setup
    reset = jax.jit(env.reset, static_argnums=1)

    def build(eval_config):
        keys = jax.random.split(jax.random.split(jax.random.key(eval_config.seed))[0], eval_config.num_envs)
        states = [jax.device_get(reset(k, params)) for k in keys]
        return [states[b // eval_config.samples_per_env]
                for b in range(eval_config.num_envs * eval_config.samples_per_env)]

    return build


@pytest.fixture(scope="module")
def validated(setup):
    """Two validations of a random tiny model and one of another model (one compile)."""
    env, params, _, codec, prompt = setup
    model = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS), jax.random.key(0))
    other = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS), jax.random.key(1))
    validator = Validator(model, env, params, codec, prompt, EVAL, TRAIN)
    first = validator(nnx.state(model))
    again = validate(model, env, params, codec, prompt, EVAL, TRAIN)  # same static setting: no recompile
    elsewhere = validator(nnx.state(other))
    return first, again, elsewhere


def numpy_metrics(traj, k):
    t = jax.device_get(traj)
    played = np.asarray(t.turn_active).sum()
    success = np.asarray(t.success)
    return {
        "success": success.mean(),
        "return": np.asarray(t.episode_reward, np.float64).mean(),
        "valid_action_rate": np.asarray(t.turn_valid).sum() / played,
        "actions": np.asarray(t.num_actions).mean(),
        "turns": np.asarray(t.turn_active).sum(axis=1).mean(),
        "response_length": np.asarray(t.gen_lengths).sum() / played,
        "pass@k": success.reshape(-1, k).any(axis=1).mean(),
    }


def slots(setup, traj, b, t):
    """(observation ids, generation ids) of row b, turn t, from the buffer layout rebuilt here."""
    _, params, _, codec, prompt = setup
    rows, cols = params.dim_room
    obs_len = prompt.observation_capacity(codec, rows, cols)
    start = len(prompt.system_ids) + t * (obs_len + TRAIN.max_new_tokens)
    tokens, mask = np.asarray(traj.tokens[b]), np.asarray(traj.mask[b])
    obs, gen = slice(start, start + obs_len), slice(start + obs_len, start + obs_len + TRAIN.max_new_tokens)
    return tokens[obs][mask[obs]], tokens[gen][mask[gen]]


def check_first_observations(setup, traj, states):
    """Turn 1 of every row shows the given level."""
    env, params, tok, _, prompt = setup
    for b, state in enumerate(states):
        text = prompt.observation_text(1, env.render_text(state, params), TRAIN.max_actions_per_traj)
        obs, _ = slots(setup, traj, b, 0)
        assert list(obs) == tok.encode(text, add_special_tokens=False), b


# ----------------------------------------------------------------------------- config


def test_eval_rollout_config_takes_budgets_from_training():
    config = EVAL.rollout_config(TRAIN)
    assert (config.num_groups, config.group_size) == (3, 2)
    assert (config.max_turns, config.max_actions_per_turn, config.max_actions_per_traj, config.max_new_tokens) == (
        TRAIN.max_turns, TRAIN.max_actions_per_turn, TRAIN.max_actions_per_traj, TRAIN.max_new_tokens)
    assert config.format_penalty == TRAIN.format_penalty
    assert config.sampling == sampling.SamplingParams(temperature=0.5, top_p=1.0, top_k=0)
    # a level's samples are independent attempts even when training shares a group's env noise
    assert not EVAL.rollout_config(dataclasses.replace(TRAIN, shared_env_noise=True)).shared_env_noise
    defaults = EvalConfig()
    assert (defaults.num_envs, defaults.samples_per_env, defaults.temperature) == (32, 1, 0.5)


@pytest.mark.parametrize("field, value, message", [
    ("num_envs", 0, "eval.num_envs=0"),
    ("samples_per_env", 1.5, "eval.samples_per_env=1.5"),
    ("samples_per_env", True, "eval.samples_per_env=True"),
    ("temperature", -0.1, "eval.temperature=-0.1"),
    ("top_p", 0.0, "eval.top_p=0.0"),
    ("seed", -1, "eval.seed=-1"),
])
def test_invalid_eval_config_names_the_key(field, value, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**{field: value})


# ----------------------------------------------------------------------------- model validation


def test_metrics_equal_numpy_recomputation(validated):
    (metrics, traj), _, _ = validated
    assert all(isinstance(v, float) for v in metrics.values())
    for name, value in numpy_metrics(traj, EVAL.samples_per_env).items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-6, err_msg=name)
    assert metrics["pass@k"] >= metrics["success"]
    assert traj.tokens.shape[0] == EVAL.num_envs * EVAL.samples_per_env
    assert int(np.asarray(traj.gen_lengths).max()) <= TRAIN.max_new_tokens


def test_fixed_seeds_give_identical_results_on_the_seeds_levels(setup, levels, validated):
    (metrics, traj), (metrics_again, traj_again), (_, traj_other) = validated
    assert metrics == metrics_again
    np.testing.assert_array_equal(np.asarray(traj.tokens), np.asarray(traj_again.tokens))
    # Both models played the levels of the eval seed, whatever their weights; samples differ.
    states = levels(EVAL)
    check_first_observations(setup, traj, states)
    check_first_observations(setup, traj_other, states)
    assert not np.array_equal(np.asarray(traj.tokens), np.asarray(traj_other.tokens))
    # Another seed gives other levels (so the seed is what chooses them).
    other_seed = levels(EvalConfig(num_envs=3, samples_per_env=2, seed=8))
    assert any(not np.array_equal(a.room_state, b.room_state) for a, b in zip(states, other_seed))


def test_another_seed_plays_its_levels_without_recompiling(setup, levels, validated):
    """The seed's key is an argument of the compiled validation: other levels, same program."""
    from ragen_jax.training import validation

    env, params, _, codec, prompt = setup
    model = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS), jax.random.key(0))
    compiled = validation._validate_compiled._cache_size()
    reseeded = dataclasses.replace(EVAL, seed=8)
    _, traj = validate(model, env, params, codec, prompt, reseeded, TRAIN)
    assert validation._validate_compiled._cache_size() == compiled
    check_first_observations(setup, traj, levels(reseeded))


def test_validation_on_a_data_only_mesh_plays_like_one_device(setup, validated):
    """On a mesh that splits only `data` each device plays its own rows (`rollout_on_mesh`):
    the same trajectories and metrics as the validation on one device."""
    from ragen_jax.core import sharding

    env, params, _, codec, prompt = setup
    model = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS), jax.random.key(0))
    metrics, traj = Validator(model, env, params, codec, prompt, EVAL, TRAIN,
                              sharding.make_mesh((2, 1, 1)))(nnx.state(model))
    ref_metrics, ref_traj = validated[0]
    np.testing.assert_array_equal(np.asarray(traj.tokens), np.asarray(ref_traj.tokens))
    np.testing.assert_allclose(np.asarray(traj.logprobs), np.asarray(ref_traj.logprobs), atol=1e-5)
    assert metrics.keys() == ref_metrics.keys()
    for name in metrics:
        np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-6, err_msg=name)


def test_start_states_are_the_seeds_levels(setup, levels):
    """`EvalConfig.start_states` (host analyses of the validation levels) against the levels
    rebuilt here from the seed alone, row by row."""
    env, params, *_ = setup
    starts = EVAL.start_states(env, params, TRAIN)
    expected = levels(EVAL)
    assert np.asarray(starts.room_state).shape[0] == len(expected)
    for b, state in enumerate(expected):
        np.testing.assert_array_equal(np.asarray(starts.room_state)[b], state.room_state)
        np.testing.assert_array_equal(np.asarray(starts.room_fixed)[b], state.room_fixed)
        np.testing.assert_array_equal(np.asarray(starts.player)[b], state.player)


def test_reasoning_check_gives_no_metrics_to_a_policy_without_the_template(setup, validated):
    """A random model never writes "Player (r, c)": no `reasoning/*` metrics rather than zeros
    (the shipped warm start's are checked in tests/sft)."""
    from ragen_jax.diagnostics import reasoning_check

    _, _, tok, _, _ = setup
    (_, traj), _, _ = validated
    assert reasoning_check.validation_metrics(jax.device_get(traj), tok, *setup[:2]) == {}


def test_render_shows_every_turns_observation_and_generation(setup, validated):
    env, _, tok, _, prompt = setup
    (_, traj), _, _ = validated
    text = render_trajectories(traj, tok, count=3, action_names=env.action_names, group_size=EVAL.samples_per_env)
    # distinct levels first: rows 0, 2, 4 (the first sample of each level)
    headers = [line for line in text.splitlines() if line.startswith("Trajectory ")]
    assert [h.split("(row ")[1].split(",")[0] for h in headers] == ["0", "2", "4"]
    assert tok.decode(list(np.asarray(prompt.system_ids)), **DECODE) in text
    for b in (0, 2, 4):
        for t in range(TRAIN.max_turns):
            if bool(traj.turn_active[b, t]):
                obs, gen = slots(setup, traj, b, t)
                assert tok.decode(list(obs), **DECODE) in text, (b, t)
                assert tok.decode(list(gen), **DECODE) in text, (b, t)
    assert text.count("---- Turn 1 ----") == 3
    assert "[parsed actions] none (invalid answer" in text  # a random model rarely answers
    # The trajectories carry the layout the test rebuilds by hand (`slots`).
    _, params, _, codec, _ = setup
    assert traj.layout == BufferLayout(system=len(prompt.system_ids),
                                       observation=prompt.observation_capacity(codec, *params.dim_room),
                                       generation=TRAIN.max_new_tokens, turns=TRAIN.max_turns)
    with pytest.raises(ValueError, match="row 6 is out of range"):
        render_trajectories(traj, tok, rows=[6])


# ----------------------------------------------------------------------------- scripted: nonzero success


@pytest.fixture(scope="module")
def scripted(setup, levels):
    """Sample 1 of each level follows the solver's plan (2 actions a turn), sample 2 writes
    no answer. Levels with plans beyond the 4-action budget stay unsolved."""
    env, params, tok, codec, prompt = setup
    states = levels(SCRIPTED_EVAL)
    config = SCRIPTED_EVAL.rollout_config(TRAIN)
    tokens = np.zeros((config.batch, config.max_turns, config.max_new_tokens), np.int32)
    lengths = np.zeros((config.batch, config.max_turns), np.int32)
    planned = {}
    for b, state in enumerate(states):
        if b % config.group_size == 0:
            fixed, room = np.asarray(state.room_fixed), np.asarray(state.room_state)
            plan = solve_sokoban(fixed == 0, fixed == 2, (room == 3) | (room == 4), np.asarray(state.player))
            turns = [[env.action_names[a - 1] for a in plan[i: i + 2]] for i in range(0, len(plan), 2)]
            planned[b] = (len(plan) <= config.max_actions_per_traj, turns[: config.max_turns])
            texts = [f" plan </think> <answer> {' || '.join(names)} </answer>" for names in planned[b][1]]
        else:
            texts = [" no idea </think>"] * config.max_turns
        for t, text in enumerate(texts):
            ids = tok.encode(text, add_special_tokens=False)
            tokens[b, t, : len(ids)], lengths[b, t] = ids, len(ids)
    run = jax.jit(lambda tk, ln: validation_rollout(lambda part: ScriptedPolicy(tk, ln), env, params, codec, prompt,
                                                    SCRIPTED_EVAL, TRAIN))
    metrics, traj = run(tokens, lengths)
    return {k: float(v) for k, v in metrics.items()}, traj, planned, states


def test_scripted_success_and_pass_at_k(setup, scripted):
    env, _, tok, _, prompt = setup
    metrics, traj, planned, states = scripted
    k = SCRIPTED_EVAL.samples_per_env
    for name, value in numpy_metrics(traj, k).items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-6, err_msg=name)
    solvable = np.array([planned[b][0] for b in sorted(planned)])
    success = np.asarray(traj.success).reshape(-1, k)
    np.testing.assert_array_equal(success[:, 0], solvable)
    assert not success[:, 1].any()
    assert solvable.any() and not solvable.all(), "the seed should give solvable and unsolvable levels"
    np.testing.assert_allclose(metrics["pass@k"], solvable.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["success"], solvable.mean() / k, rtol=1e-6)
    assert metrics["pass@k"] > metrics["success"] > 0
    assert 0 < metrics["valid_action_rate"] < 1
    check_first_observations(setup, traj, states)

    text = render_trajectories(traj, tok, count=len(states), action_names=env.action_names, group_size=k)
    for b, (_, turns) in planned.items():
        played = int(np.asarray(traj.turn_active[b]).sum())
        for names in turns[:played]:
            assert f"[parsed actions] {', '.join(names)}\n" in text
    assert "SUCCESS" in text and "success: yes" in text
    assert text.count("[parsed actions] none (invalid answer") == int(np.asarray(traj.turn_active[1::2]).sum())
