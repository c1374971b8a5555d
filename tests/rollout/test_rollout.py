"""The jitted multi-turn rollout: scripted solver and garbage policies, and log-prob replay."""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.envs import registry
from ragen_jax.envs.solver import solve_sokoban
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rollout.play import RolloutConfig, initial_states, rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.text.answer_re import parse_answer_text
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate

from agent_setup import TEST_LAYERS, ScriptedPolicy, scripted_texts, text_parts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "text"))
import real_tokenizers  # noqa: E402

CONFIG = RolloutConfig(num_groups=3, group_size=2, max_turns=4, max_actions_per_turn=2, max_actions_per_traj=6,
                       max_new_tokens=24)


@pytest.fixture(scope="module")
def setup():
    return text_parts("SimpleSokoban", CONFIG.max_actions_per_turn)


@pytest.fixture(scope="module", params=["builtin", "smollm2"])
def any_setup(request, setup):
    """`setup` with the built-in tokenizer, then with SmolLM2's (tests/text/real_tokenizers.py), whose
    GPT-2 pre-tokenizer differs from the built-in Qwen-style one; one real tokenizer here, since each
    compiles the rollout again (tests/rollout/test_text_envs.py runs Qwen's too)."""
    if request.param == "builtin":
        return setup
    tok = getattr(real_tokenizers, f"{request.param}_tokenizer")()
    env, params = registry.make("SimpleSokoban")
    return (env, params, tok, TextCodec.build(tok, env, CONFIG.max_actions_per_turn),
            PromptTemplate.build(tok, env, CONFIG.max_actions_per_turn))


def scripted(tok, texts):
    return scripted_texts(tok, texts, CONFIG)


_SCRIPTED = {}


def run(setup, scripted_tokens, key):
    """A rollout of a ScriptedPolicy; one compile per environment (the script is an argument)."""
    env, params, tok, codec, prompt = setup
    if (env.name, id(tok)) not in _SCRIPTED:
        _SCRIPTED[env.name, id(tok)] = jax.jit(
            lambda k, tokens, lengths: rollout(k, ScriptedPolicy(tokens, lengths), env, params, codec, prompt, CONFIG)
        )
    return _SCRIPTED[env.name, id(tok)](key, *scripted_tokens)


def test_solver_policy_succeeds_with_expected_returns(setup):
    env, params, tok, _, _ = setup
    key = jax.random.key(0)
    states = initial_states(jax.random.split(key)[0], env, params, CONFIG)
    texts, expected = [], []
    step = jax.jit(env.step, static_argnums=3)
    for b in range(CONFIG.batch):
        state = jax.tree.map(lambda a: a[b], states)
        fixed, room = np.asarray(state.room_fixed), np.asarray(state.room_state)
        plan = solve_sokoban(fixed == 0, fixed == 2, (room == 3) | (room == 4), np.asarray(state.player))
        plan = plan[: CONFIG.max_actions_per_traj]
        chunks = [plan[i : i + 2] for i in range(0, len(plan), 2)][: CONFIG.max_turns]
        names = [" || ".join(env.action_names[a - 1] for a in chunk) for chunk in chunks]
        texts.append([f" I follow the plan. </think> <answer> {n} </answer>" for n in names])
        total = 0.0
        for a in [a for chunk in chunks for a in chunk]:
            state, r, done, _ = step(jax.random.key(0), state, a, params)
            total += float(r)
        expected.append((total, bool(state.success), sum(map(len, chunks))))
    traj = run(setup, scripted(tok, texts), key)
    for b, (total, success, taken) in enumerate(expected):
        np.testing.assert_allclose(float(traj.episode_reward[b]), total, rtol=1e-5)
        assert bool(traj.success[b]) == success and int(traj.num_actions[b]) == taken
        active = np.asarray(traj.turn_active[b])
        assert np.all(np.asarray(traj.turn_valid[b])[active])
        np.testing.assert_allclose(float(traj.token_rewards[b].sum()), total, rtol=1e-5)
    assert bool(traj.success.any())
    assert np.all(np.asarray(traj.loss_mask) <= np.asarray(traj.mask))


def test_garbage_policy_only_collects_format_penalties(setup):
    env, params, tok, _, _ = setup
    key = jax.random.key(1)
    texts = [[" hmm </think> nothing to see"] * CONFIG.max_turns for _ in range(CONFIG.batch)]
    traj = run(setup, scripted(tok, texts), key)
    np.testing.assert_allclose(np.asarray(traj.episode_reward), CONFIG.max_turns * CONFIG.format_penalty, rtol=1e-6)
    assert not np.asarray(traj.turn_valid).any() and int(traj.num_actions.max()) == 0
    assert np.asarray(traj.turn_active).all()
    np.testing.assert_array_equal(np.asarray(traj.gen_lengths), np.asarray(scripted(tok, texts)[1]))


@pytest.fixture(scope="module")
def model_rollout(setup):
    """A rollout of a random-init tiny model (compiled once for the tests below)."""
    env, params, _, codec, prompt = setup
    model = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS), jax.random.key(3))
    key = jax.random.key(2)
    go = jax.jit(lambda k, m: rollout(k, model_policy(m, codec, prompt, CONFIG), env, params, codec, prompt, CONFIG))
    return model, key, go(key, model)


def test_model_logprobs_equal_a_training_forward_over_the_buffer(model_rollout):
    model, _, traj = model_rollout
    mask = traj.mask
    hidden, _ = jax.jit(lambda m, t, p, k: m(t, p, k))(model, traj.tokens, positions_from_mask(mask), mask)
    logp = jax.nn.log_softmax(model.logits(hidden), axis=-1)
    # Each token is predicted from the last valid slot before it.
    slots = jnp.arange(mask.shape[1])
    prev = jax.lax.cummax(jnp.where(mask, slots, -1), axis=1)
    prev = jnp.concatenate([jnp.full((mask.shape[0], 1), -1), prev[:, :-1]], axis=1)
    rows = jnp.arange(mask.shape[0])[:, None]
    want = logp[rows, jnp.maximum(prev, 0), traj.tokens]
    loss = np.asarray(traj.loss_mask)
    assert loss.sum() > 0
    np.testing.assert_allclose(np.asarray(traj.logprobs)[loss], np.asarray(want)[loss], atol=1e-5)


# ------------------------------------------------------------------ host-side replay

def replay(setup, traj, key):
    """Rebuild every observation, parse and env step on the host from the sampled tokens; the
    recorded state of every turn played is the replayed one."""
    env, params, tok, codec, prompt = setup
    states = initial_states(jax.random.split(key)[0], env, params, CONFIG)
    step = jax.jit(env.step, static_argnums=3)
    rows, cols = np.asarray(env.symbol_grid(jax.tree.map(lambda a: a[0], states), params)).shape
    system_len = len(prompt.system_ids)
    obs_len = prompt.observation_capacity(codec, rows, cols)
    turn_len = obs_len + CONFIG.max_new_tokens
    tokens, mask = np.asarray(traj.tokens), np.asarray(traj.mask)
    end_id = prompt.end_of_message_id
    for b in range(CONFIG.batch):
        state = jax.tree.map(lambda a: a[b], states)
        taken, last_reward, warning, closed, total = 0, None, False, False, 0.0
        for t in range(CONFIG.max_turns):
            active = not (bool(state.done) or taken >= CONFIG.max_actions_per_traj)
            assert bool(traj.turn_active[b, t]) == active
            start = system_len + t * turn_len
            obs = tokens[b, start : start + obs_len][mask[b, start : start + obs_len]]
            gen = tokens[b, start + obs_len : start + turn_len][mask[b, start + obs_len : start + turn_len]]
            if not active:
                assert len(obs) == 0 and len(gen) == 0
                continue
            shown = jax.tree.map(lambda a: np.asarray(a)[b, t], traj.turn_states)  # what games grade reasoning on
            jax.tree.map(np.testing.assert_array_equal, shown, jax.device_get(state))
            text = prompt.observation_text(t + 1, env.render_text(state, params), CONFIG.max_actions_per_traj - taken,
                                           last_reward, warning, closed)
            assert list(obs) == tok.encode(text, add_special_tokens=False), (b, t)
            actions, valid = parse_answer_text(tok.decode(list(gen)), env.action_names, CONFIG.max_actions_per_turn)
            assert bool(traj.turn_valid[b, t]) == valid, (b, t, tok.decode(list(gen)))
            text_gen = tok.decode(list(gen))
            if text_gen.isascii():  # then characters are bytes: count tokens ending before </think>
                close = text_gen.find("</think>")
                want = 0 if close < 0 else sum(len(tok.decode(list(gen[: k + 1]))) <= close for k in range(len(gen)))
                assert int(traj.reasoning_lengths[b, t]) == want, (b, t, text_gen)
            assert traj.layout.generation_offsets[t] == start + obs_len
            reward = 0.0 if valid else CONFIG.format_penalty
            for a in actions:
                if bool(state.done) or taken >= CONFIG.max_actions_per_traj:
                    break
                state, r, _, _ = step(jax.random.key(0), state, a, params)
                reward += float(r)
                taken += 1
            np.testing.assert_allclose(float(traj.turn_reward[b, t]), reward, atol=1e-5)
            last_reward, warning, total = np.float32(reward), not valid, total + reward
            closed = len(gen) > 0 and int(gen[-1]) == end_id
        np.testing.assert_allclose(float(traj.episode_reward[b]), total, atol=1e-5)
        assert int(traj.num_actions[b]) == taken and bool(traj.success[b]) == bool(state.success)


def test_host_replay_of_a_random_model_rollout(setup, model_rollout):
    _, key, traj = model_rollout
    replay(setup, traj, key)


def test_host_replay_of_random_scripted_answers(any_setup):
    setup = any_setup
    env, params, tok, _, _ = setup
    rng = np.random.default_rng(0)
    names = list(env.action_names) + ["up", "RIGHT", "Jump"]
    texts = []
    for _ in range(CONFIG.batch):
        row = []
        for _ in range(CONFIG.max_turns):
            chosen = " || ".join(rng.choice(names, size=rng.integers(1, 4)))
            row.append(rng.choice([f" go </think> <answer> {chosen} </answer>", f" x </think><answer>{chosen}</answer>",
                                   " no answer </think>"]))
        texts.append(row)
    key = jax.random.key(5)
    traj = run(setup, scripted(tok, texts), key)
    assert np.asarray(traj.turn_valid).any() and not np.asarray(traj.turn_valid).all()
    replay(setup, traj, key)


def random_move_texts(env, rows, seed):
    """rows × max_turns answers of two random moves each."""
    rng = np.random.default_rng(seed)
    return [[f" ok </think> <answer> {' || '.join(rng.choice(env.action_names, size=2))} </answer>"
             for _ in range(CONFIG.max_turns)] for _ in range(rows)]


def test_host_replay_on_frozenlake():
    setup = text_parts("FrozenLake", CONFIG.max_actions_per_turn, success_rate=1.0)  # deterministic: replayable
    env, tok = setup[0], setup[2]
    texts = random_move_texts(env, CONFIG.batch, 1)
    key = jax.random.key(7)
    traj = run(setup, scripted(tok, texts), key)
    assert np.asarray(traj.turn_valid)[np.asarray(traj.turn_active)].all()
    replay(setup, traj, key)


def test_shared_env_noise_gives_a_group_the_same_slips():
    """Members of a group writing the same moves on a slippery lake: with `shared_env_noise` their
    trajectories (observations, rewards) are identical, since move n of every member draws the
    same slip; with independent noise some group's members end apart."""
    env, params, tok, codec, prompt = text_parts("FrozenLake", CONFIG.max_actions_per_turn, success_rate=0.5)
    group_texts = random_move_texts(env, CONFIG.num_groups, 3)
    texts = [group_texts[b // CONFIG.group_size] for b in range(CONFIG.batch)]
    tokens, lengths = scripted(tok, texts)
    apart = {}
    for shared in (True, False):
        config = dataclasses.replace(CONFIG, shared_env_noise=shared)
        traj = jax.jit(lambda k, t, n: rollout(k, ScriptedPolicy(t, n), env, params, codec, prompt, config))(
            jax.random.key(5), tokens, lengths)
        pairs = np.asarray(traj.tokens).reshape(CONFIG.num_groups, CONFIG.group_size, -1)
        rewards = np.asarray(traj.turn_reward).reshape(CONFIG.num_groups, CONFIG.group_size, -1)
        apart[shared] = [not (np.array_equal(p[0], p[1]) and np.array_equal(r[0], r[1])) for p, r in zip(pairs, rewards)]
    assert not any(apart[True])
    assert any(apart[False])


def test_shared_env_noise_must_be_a_bool():
    with pytest.raises(ValueError, match=r"rollout.shared_env_noise='yes' must be true or false"):
        RolloutConfig(shared_env_noise="yes")
