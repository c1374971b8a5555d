"""The prompt: the text of docs/method.md#the-prompt, the chat template, and in-graph assembly
== tokenizer.encode."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from ragen_jax.envs.registry import make
from ragen_jax.text import build_tokenizer
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import (FORMAT_PROMPT, INVALID_WARNING, ChatPieces, PromptTemplate, format_reward,
                                   observation_ids, system_content, system_message, turn_ids, user_content)
from text_helpers import encode, grid_text, valid_ids

_assemble = jax.jit(observation_ids)


def assemble(prompt, codec, grid, turn, actions_left, reward, warning, closed=False):
    """One compile per board shape and tokenizer: the numbers always go in as typed scalars."""
    return _assemble(prompt, codec, jnp.asarray(grid, jnp.int32), np.int32(turn), np.int32(actions_left),
                     np.float32(reward), np.bool_(warning), np.bool_(closed))


@pytest.fixture(scope="module")
def built(prompts, codecs):
    """(tokenizer, env name) -> (prompt, codec) for 2 actions per turn, built once per session."""
    return lambda tokenizer, name: (prompts(tokenizer, name), codecs(tokenizer, name))


def test_the_tokenizers_corpus_holds_the_prompts_texts():
    """The built-in tokenizer learns from user messages the prompt itself writes: its format
    line, its warning and its reward lines are in the corpus."""
    text = "\n".join(build_tokenizer.corpus(60, seed=0))
    assert FORMAT_PROMPT in text and INVALID_WARNING in text and "Reward:\n-0.1\n" in text
    assert system_message(build_tokenizer.SOKOBAN_RULES, build_tokenizer.SOKOBAN_ACTIONS, 2) in text


@pytest.mark.parametrize("name", ["SimpleSokoban", "FrozenLake"])
def test_system_content(name):
    env, _ = make(name)
    text = system_content(env, 3)
    assert text.startswith("You're a helpful assistant. " + env.instructions())
    assert f"\nYour available actions are:\n{', '.join(env.action_names)}\n" in text
    assert text.endswith('You can make up to 3 actions per turn, separated by the action separator " || "')


def test_user_content_is_specs_template():
    spec = ("Turn {n}:\nState:\n{state}\nYou have {k} actions left. Always output: <think> [Your thoughts] "
            "</think> <answer> [your answer] </answer> with no extra text. Strictly follow this format.")
    assert user_content(1, "# P", 10) == spec.format(n=1, state="# P", k=10)
    later = user_content(3, "# P", 6, reward=-0.2, warning=True)
    assert later == f"Reward:\n-0.2\n{INVALID_WARNING}\n" + spec.format(n=3, state="# P", k=6)
    assert user_content(2, "_", 0, reward=1.0) == "Reward:\n1\n" + spec.format(n=2, state="_", k=0)


def test_format_reward():
    cases = {-0.1: "-0.1", 0.0: "0", -0.0: "0", 1.0: "1", 10.9: "10.9", -1.1: "-1.1", 0.25: "0.25",
             -0.1 - 0.1 - 0.1: "-0.3", 9.8: "9.8", 0.004: "0", -12345.5: "-12345.5"}
    for reward, text in cases.items():
        assert format_reward(reward) == text
        assert format_reward(np.float32(reward)) == text


def test_bad_arguments_raise():
    for kwargs, match in [(dict(turn=0), "turn=0"), (dict(actions_left=-1), "actions_left=-1"),
                          (dict(actions_left=10000), "actions_left=10000"),
                          (dict(turn=2), "reward=None"), (dict(reward=0.5), "reward=0.5"),
                          (dict(warning=True), "warning=True")]:
        args = dict(turn=1, state="#", actions_left=3) | kwargs
        with pytest.raises(ValueError, match=match):
            user_content(**args)
    with pytest.raises(ValueError, match="reward=10000000.0"):
        format_reward(1e7)


def test_chat_pieces_are_chatml(builtin_tokenizer, built):
    prompt, _ = built(builtin_tokenizer, "SimpleSokoban")
    assert prompt.chat == ChatPieces("<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n",
                                     "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n")
    assert (prompt.end_of_message_id, prompt.end_of_message) == (2, "<|im_end|>")


# One generation per kind: with reasoning, and one the template cannot split into reasoning.
GENERATIONS = [" Push. </think> <answer> Up </answer>", " Push up. <answer> Up </answer>"]


@pytest.mark.parametrize("generated", GENERATIONS)
def test_chat_pieces_rebuild_the_template(tokenizer, built, generated):
    """system + obs 1 + generation + obs 2 == the chat template over the same messages + <think>,
    for a template that renders past assistant messages verbatim (`ChatPieces.verbatim_history`);
    one that drops their reasoning (Qwen3's) differs by exactly the `<think>` prefix and reasoning."""
    tok = tokenizer
    prompt, _ = built(tok, "SimpleSokoban")
    messages = [{"role": "system", "content": prompt.system},
                {"role": "user", "content": user_content(1, "# P\n# _", 10)},
                {"role": "assistant", "content": "<think>" + generated},
                {"role": "user", "content": user_content(2, "# _\n# P", 9, reward=-0.1, warning=True)}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
    first = prompt.system_text() + prompt.observation_text(1, "# P\n# _", 10)
    assert first == tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True) + "<think>"
    second = prompt.observation_text(2, "# _\n# P", 9, reward=-0.1, warning=True)
    closed = prompt.observation_text(2, "# _\n# P", 9, reward=-0.1, warning=True, closed=True)
    if not prompt.chat.verbatim_history and "</think>" in generated:
        # the template drops the past turn's <think> prefix and reasoning
        first, generated = first.removesuffix("<think>"), generated.split("</think>")[-1]
    assert first + generated + second == expected
    # A generation that stopped on the end-of-message token closed its message: the next
    # observation skips it.
    assert first + generated + prompt.end_of_message + closed == expected


def test_qwen3_template_drops_past_reasoning(qwen_tokenizer, built):
    """Qwen3's template renders a past assistant message without its `<think>...</think>`; the
    rollout's buffer keeps the generation verbatim, so from turn 2 on the buffer is not that
    template's rendering. `verbatim_history` records it."""
    prompt, _ = built(qwen_tokenizer, "SimpleSokoban")
    assert not prompt.chat.verbatim_history


def test_first_turn_ids_are_the_chat_template(tokenizer, prompts, codecs):
    """The prompt a rollout starts from, assembled in JAX (system ids, then turn 1's ids from the
    env's state tokens) == encode(chat template over the messages + "<think>"), token for token."""
    for name in ("SimpleSokoban", "FrozenLake", "Countdown"):
        env, params = make(name)
        prompt, codec = prompts(tokenizer, name), codecs(tokenizer, name)
        for seed in range(2):
            state = _reset(env, jax.random.key(seed), params)
            state_ids = _state_tokens(env, state, params, codec)
            ids, mask = _turn(prompt, state_ids, np.int32(1), np.int32(10), np.float32(0), np.bool_(False))
            board = env.render_text(state, params)
            messages = [{"role": "system", "content": prompt.system},
                        {"role": "user", "content": user_content(1, board, 10)}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
            assert [int(i) for i in np.asarray(prompt.system_ids)] + valid_ids(ids, mask) == encode(tokenizer, text)


_reset = jax.jit(lambda env, key, params: env.reset(key, params), static_argnums=(0, 2))
_state_tokens = jax.jit(lambda env, state, params, codec: env.state_tokens(state, params, codec), static_argnums=(0, 2))
_turn = jax.jit(turn_ids)


def test_system_ids(tokenizer, built):
    prompt, codec = built(tokenizer, "FrozenLake")
    system = [int(i) for i in np.asarray(prompt.system_ids)]
    assert system == encode(tokenizer, prompt.system_text())
    grid = np.array([[3, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 2]])
    obs = valid_ids(*assemble(prompt, codec, grid, 1, 10, 0.0, False))
    text = prompt.system_text() + prompt.observation_text(1, grid_text(codec.symbols, grid), 10)
    assert system + obs == encode(tokenizer, text)  # the two segments do not merge either


rewards = st.one_of(st.sampled_from([-0.1, -0.2, 0.9, 10.9, -1.1, 0.0, 1.0, 0.8, 9.8, -0.3, 21.8]),
                    st.floats(-99999, 99999, width=32))


@pytest.mark.parametrize("name,shape", [("SimpleSokoban", (6, 6)), ("FrozenLake", (4, 4))])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_assembly_equals_encode(tokenizer, built, name, shape, data):
    prompt, codec = built(tokenizer, name)
    grid = data.draw(arrays(np.int32, shape, elements=st.integers(0, len(codec.symbols) - 1)))
    turn = data.draw(st.one_of(st.integers(1, 6), st.integers(1, 9999)))
    left = data.draw(st.one_of(st.integers(0, 10), st.integers(0, 9999)))
    reward, warning, closed = data.draw(rewards), data.draw(st.booleans()), data.draw(st.booleans())
    ids, mask = assemble(prompt, codec, grid, turn, left, reward, warning, closed)
    assert ids.shape == (prompt.observation_capacity(codec, *shape),)
    later = turn > 1
    text = prompt.observation_text(turn, grid_text(codec.symbols, grid), left,
                                   reward if later else None, warning and later, closed)
    assert valid_ids(ids, mask) == encode(tokenizer, text)


def test_assembly_vmaps_over_a_batch(builtin_tokenizer, built):
    """As the rollout calls it: boards, turns, budgets, rewards and warnings per row."""
    tok = builtin_tokenizer
    prompt, codec = built(tok, "FrozenLake")
    rng = np.random.default_rng(0)
    grids = rng.integers(0, len(codec.symbols), (3, 4, 4)).astype(np.int32)
    turns, lefts = np.array([1, 2, 5], np.int32), np.array([10, 8, 0], np.int32)
    rewards, warnings = np.array([0.0, -0.1, 1.0], np.float32), np.array([False, True, False])
    closed = np.array([True, True, False])
    batched = jax.jit(jax.vmap(observation_ids, in_axes=(None, None, 0, 0, 0, 0, 0, 0)))
    ids, mask = batched(prompt, codec, grids, turns, lefts, rewards, warnings, closed)
    for b in range(3):
        later = turns[b] > 1
        text = prompt.observation_text(int(turns[b]), grid_text(codec.symbols, grids[b]), int(lefts[b]),
                                       float(rewards[b]) if later else None, bool(warnings[b]), bool(closed[b]))
        assert valid_ids(ids[b], mask[b]) == encode(tok, text)


def test_without_a_chat_template(builtin_tokenizer):
    tok = copy.deepcopy(builtin_tokenizer)
    tok.chat_template = None
    env, _ = make("SimpleSokoban")
    prompt, codec = PromptTemplate.build(tok, env, 2), TextCodec.build(tok, env, 2)
    assert prompt.chat == ChatPieces() and prompt.system_text() == prompt.system + "\n"
    assert prompt.end_of_message_id == -1  # nothing to skip: `closed` changes nothing
    grid = np.array([[0, 0, 0, 0, 0, 0], [0, 5, 4, 2, 1, 0], [0, 1, 3, 1, 6, 0]] + [[0] * 6] * 3)
    ids, mask = assemble(prompt, codec, grid, 2, 4, -0.1, True, True)
    text = prompt.observation_text(2, grid_text(env.symbols, grid), 4, reward=-0.1, warning=True)
    assert text.startswith("\nReward:\n-0.1\n") and text.endswith("\n<think>")
    assert valid_ids(ids, mask) == encode(tok, text)


def test_unusable_chat_templates_raise(builtin_tokenizer):
    tok = copy.deepcopy(builtin_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] | lower }}{% endfor %}"
    with pytest.raises(ValueError, match="@@SYSTEM@@"):
        ChatPieces.from_tokenizer(tok)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<gen>{% endif %}")
    with pytest.raises(ValueError, match="opens the generation with '<gen>'"):
        ChatPieces.from_tokenizer(tok)


class _SpaceDigitMerging:
    """The built-in tokenizer, but reading " 5" as one token (GPT-2-style vocabularies merge a
    space with a digit), so "Turn " + "5" and "You have " + "5" are not token boundaries."""

    def __init__(self, tok):
        self.tok, self.merged = tok, len(tok) - 1  # the id " 5" gets (any id does)

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, text, add_special_tokens=False):
        first, *rest = text.split(" 5")
        ids = self.tok.encode(first, add_special_tokens=False)
        for part in rest:
            ids += [self.merged] + self.tok.encode(part, add_special_tokens=False)
        return ids

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [self.encode(t) for t in texts]}


def test_build_refuses_a_tokenizer_that_merges_across_number_pieces(builtin_tokenizer):
    """Numbers are gathered one token per character; every digit is tried next to every
    neighbour it can have, not only the few numbers of a sample prompt."""
    tok = _SpaceDigitMerging(builtin_tokenizer)
    assert tok.encode("Turn 5:") != tok.encode("Turn ") + tok.encode("5") + tok.encode(":")
    with pytest.raises(ValueError, match=r"merges tokens across the prompt pieces of .*You have 5 actions"):
        PromptTemplate.build(tok, make("SimpleSokoban")[0], 2)
