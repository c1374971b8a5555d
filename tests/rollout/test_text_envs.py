"""The rollout with environments that read their answer as text (Countdown, QA): scripted answers
with known rewards, and the buffer's observations against the host-side prompt text."""

import os
import re
import sys
from decimal import Decimal
from fractions import Fraction

import jax
import numpy as np
import pytest

from ragen_jax.envs import registry
from ragen_jax.envs.countdown import CountdownState
from ragen_jax.models import hf
from ragen_jax.rollout.play import RolloutConfig, rollout
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate

from agent_setup import ScriptedPolicy, scripted_texts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "text"))
import real_tokenizers  # noqa: E402

CONFIG = RolloutConfig(num_groups=3, group_size=2, max_turns=2, max_actions_per_turn=1, max_actions_per_traj=2,
                       max_new_tokens=100)
# The built-in tokenizer and the real ones (tests/text/real_tokenizers.py).
TOKENIZERS = {"builtin": hf.load_tokenizer, "qwen": real_tokenizers.qwen_tokenizer,
              "smollm2": real_tokenizers.smollm2_tokenizer}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


def solve(numbers, target):
    """An expression using each number once that equals target (Python, exact), or None."""
    def exprs(items):
        if len(items) == 1:
            yield Fraction(items[0][0]), items[0][1]
            return
        for mask in range(1, 2 ** len(items) - 1):
            left = [x for i, x in enumerate(items) if mask >> i & 1]
            right = [x for i, x in enumerate(items) if not mask >> i & 1]
            for a, ta in exprs(left):
                for b, tb in exprs(right):
                    yield a + b, f"({ta} + {tb})"
                    yield a - b, f"({ta} - {tb})"
                    yield a * b, f"{ta} * {tb}"
                    if b:
                        yield a / b, f"{ta} / ({tb})"

    return next((text for value, text in exprs([(n, str(n)) for n in numbers]) if value == target), None)


def scripted(tok, texts):
    return scripted_texts(tok, texts, CONFIG)


@pytest.fixture(scope="module")
def countdown(tokenizer):
    env, params = registry.make("Countdown")
    tok = tokenizer
    codec = TextCodec.build(tok, env, CONFIG.max_actions_per_turn)
    prompt = PromptTemplate.build(tok, env, CONFIG.max_actions_per_turn)
    go = jax.jit(lambda k, t, n: rollout(k, ScriptedPolicy(t, n), env, params, codec, prompt, CONFIG))
    return env, params, tok, codec, prompt, go


def test_countdown_rewards_through_the_rollout(countdown):
    env, params, tok, codec, prompt, go = countdown
    key = jax.random.key(3)
    # A first rollout (nothing written) shows the episodes; the second answers them.
    first = go(key, *scripted(tok, [[""]] * CONFIG.batch))
    episodes = []
    for b in range(CONFIG.batch):
        seen = tok.decode([int(i) for i in np.asarray(first.tokens[b])[np.asarray(first.mask[b])]])
        match = re.search(r"State:\nNumbers: \[([0-9, ]+)\]\nTarget: ([0-9]+)\n", seen)
        episodes.append(([int(n) for n in match.group(1).split(", ")], int(match.group(2))))
    np.testing.assert_allclose(np.asarray(first.episode_reward), -0.2, atol=1e-6)  # two empty turns: penalties
    right = [solve(*e) for e in episodes]
    assert all(right)
    say = lambda answer: f" I try it. </think> <answer> {answer} </answer>"
    nums = episodes[1][0]
    texts = [
        [say(right[0])],  # 1, done after one turn
        [say(" + ".join(map(str, nums)) if sum(nums) != episodes[1][1] else " * ".join(map(str, nums)))],  # 0.1
        [say(f"{episodes[2][0][0]} + 1000")],  # wrong numbers: 0
        [say(f"{episodes[3][0][0]} +"), say(right[3])],  # malformed: -0.1, then 1
        [" no answer </think>", say("(" * 30 + right[4] + ")" * 30)],  # -0.1, then too long: -0.1
        [say(f"{episodes[5][0][0]} / (0)"), say(right[5])],  # 0 is a wrong number: 0, done
    ]
    traj = go(key, *scripted(tok, texts))
    np.testing.assert_allclose(np.asarray(traj.episode_reward), [1.0, 0.1, 0.0, 0.9, -0.2, 0.0], atol=1e-6)
    assert np.asarray(traj.success).tolist() == [True, False, False, True, False, False]
    assert np.asarray(traj.turn_active).tolist() == [[True, False], [True, False], [True, False], [True, True],
                                                     [True, True], [True, False]]
    assert np.asarray(traj.turn_valid).tolist() == [[True, False], [True, False], [True, False], [False, True],
                                                    [False, False], [True, False]]
    assert np.asarray(traj.num_actions).tolist() == [1, 1, 1, 1, 0, 1]
    np.testing.assert_allclose(np.asarray(traj.token_rewards).sum(axis=1), np.asarray(traj.episode_reward), atol=1e-6)

    # the buffer holds exactly the prompt's text: system, then each turn's observation
    tokens, mask = np.asarray(traj.tokens), np.asarray(traj.mask)
    system_len = len(prompt.system_ids)
    assert tok.decode(list(tokens[0, :system_len])) == prompt.system_text()
    assert "Your available actions" not in prompt.system_text() and "Countdown" in prompt.system_text()
    for b, t, left, reward, warning in ((0, 0, 2, None, False), (3, 1, 2, -0.1, True), (4, 1, 2, -0.1, True)):
        numbers, target = episodes[b]
        state = CountdownState(numbers=np.array(numbers + [0] * (4 - len(numbers))), count=len(numbers), target=target,
                               done=False, success=False)
        start = system_len if t == 0 else traj.layout.generation_offsets[t - 1] + CONFIG.max_new_tokens
        obs = tokens[b, start:traj.layout.generation_offsets[t]][mask[b, start:traj.layout.generation_offsets[t]]]
        text = prompt.observation_text(t + 1, env.render_text(state, params), left, reward, warning, closed=False)
        assert list(obs) == tok.encode(text, add_special_tokens=False), (b, t)


# ----------------------------------------------------------------------------- QA


@pytest.fixture(scope="module")
def mathqa(tmp_path_factory, tokenizer):
    pytest.importorskip("tensorflow_datasets", reason="the QA tests need: pip install 'ragen-jax[datasets]'")
    env, params = registry.make("MathQA", num_records=16, seed=1, max_attempts=2,
                                data_dir=str(tmp_path_factory.mktemp("tfds")))
    tok = tokenizer
    codec = TextCodec.build(tok, env, CONFIG.max_actions_per_turn)
    prompt = PromptTemplate.build(tok, env, CONFIG.max_actions_per_turn)
    go = jax.jit(lambda k, t, n: rollout(k, ScriptedPolicy(t, n), env, params, codec, prompt, CONFIG))
    return env, params, tok, prompt, go


def test_mathqa_attempts_and_answer_forms_through_the_rollout(mathqa):
    env, params, tok, prompt, go = mathqa
    key = jax.random.key(4)
    first = go(key, *scripted(tok, [[""]] * CONFIG.batch))
    answers = dict(env.records)
    questions = []
    for b in range(CONFIG.batch):
        seen = tok.decode([int(i) for i in np.asarray(first.tokens[b])[np.asarray(first.mask[b])]])
        questions.append(re.search(r"State:\n(.*)\nYou have", seen).group(1))
    right = [answers[q] for q in questions]
    wrong = [str(Decimal(a) + 1000) for a in right]
    say = lambda answer: f" Let me compute. </think> <answer> {answer} </answer>"
    texts = [
        [say(right[0])],  # 1, done
        [say(wrong[1]), say(right[1])],  # 0, then 1/2
        [say(wrong[2]), say(wrong[2])],  # 0, 0: both attempts used
        [say("  "), say(right[3])],  # empty: format penalty, no attempt; then 1
        [say(f"0{right[4]}.0" if "." not in right[4] else f"+0{right[4]}0")],  # the same number: 1
        [" no tags", say(" ".join(right[5]).upper())],  # -0.1, then spaced out: 1
    ]
    traj = go(key, *scripted(tok, texts))
    np.testing.assert_allclose(np.asarray(traj.episode_reward), [1.0, 0.5, 0.0, 0.9, 1.0, 0.9], atol=1e-6)
    assert np.asarray(traj.success).tolist() == [True, True, False, True, True, True]
    assert np.asarray(traj.turn_valid).tolist() == [[True, False], [True, True], [True, True], [False, True],
                                                    [True, False], [False, True]]
    assert np.asarray(traj.num_actions).tolist() == [1, 2, 2, 1, 1, 1]

    tokens, mask = np.asarray(traj.tokens), np.asarray(traj.mask)
    assert tok.decode(list(tokens[0, :len(prompt.system_ids)])) == prompt.system_text()
    for b, t, left, reward, warning in ((0, 0, 2, None, False), (1, 1, 1, 0.0, False), (3, 1, 2, -0.1, True)):
        start = len(prompt.system_ids) if t == 0 else traj.layout.generation_offsets[t - 1] + CONFIG.max_new_tokens
        obs = tokens[b, start:traj.layout.generation_offsets[t]][mask[b, start:traj.layout.generation_offsets[t]]]
        text = prompt.observation_text(t + 1, questions[b], left, reward, warning, closed=False)
        assert list(obs) == tok.encode(text, add_special_tokens=False), (b, t)
