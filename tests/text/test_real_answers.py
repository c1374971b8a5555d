"""Real SmolLM2-135M-Instruct answers to the project's first-turn prompts
(fixtures/smollm2_answers.json, written by fixtures/make_smollm2_answers.py), read in the graph:
the bytes, the parsed answer, the reasoning length and the stop check of the sampled ids equal
the tokenizer's decode, the Python parser (`answer_re`) and the byte references. Real samples
hold what hand-written strategies miss: characters split across tokens, stray tags, runaway
text."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.text.answer_re import parse_answer_text
from ragen_jax.text.prompt import observation_ids
from text_helpers import read_generation, reference_reasoning, reference_stop, valid_ids

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_answers.json"


@pytest.fixture(scope="module")
def samples():
    return json.loads(FIXTURE.read_text())


def test_the_fixture_is_what_the_script_describes(samples):
    meta, answers = samples["meta"], samples["answers"]
    assert meta["temperature"] == 1.0 and meta["top_p"] == 1.0 and len(answers) >= 250
    assert {a["env"] for a in answers} == {"SimpleSokoban", "FrozenLake"}
    assert all(0 < len(a["ids"]) <= meta["max_new_tokens"] for a in answers)


def test_stored_prompts_are_what_the_rollout_assembles(smollm2_tokenizer, prompts, codecs, samples):
    """The prompts the answers were sampled from, rebuilt in JAX from their boards today."""
    per_turn, budget = samples["meta"]["max_actions_per_turn"], samples["meta"]["max_actions_per_traj"]
    assemble = jax.jit(observation_ids)
    for entry in samples["prompts"]:
        tok, name = smollm2_tokenizer, entry["env"]
        prompt, codec = prompts(tok, name, per_turn), codecs(tok, name, per_turn)
        grid = [[codec.symbols.index(cell) for cell in row.split(" ")] for row in entry["board"].split("\n")]
        ids, mask = assemble(prompt, codec, jnp.asarray(grid, jnp.int32), np.int32(1), np.int32(budget),
                             np.float32(0), np.bool_(False))
        assert [int(i) for i in np.asarray(prompt.system_ids)] + valid_ids(ids, mask) == entry["prompt_ids"]


def test_sampled_answers_read_in_the_graph_equal_the_python_reference(smollm2_tokenizer, codecs, byte_tables, samples):
    tok, table = smollm2_tokenizer, byte_tables(smollm2_tokenizer)
    per_turn, width = samples["meta"]["max_actions_per_turn"], samples["meta"]["max_new_tokens"]
    read = jax.jit(jax.vmap(read_generation, in_axes=(None, 0, 0)))
    valid = 0
    for env in ("SimpleSokoban", "FrozenLake"):
        codec = codecs(tok, env, per_turn)
        answers = [a for a in samples["answers"] if a["env"] == env]
        ids = np.zeros((len(answers), width), np.int32)
        for row, a in enumerate(answers):
            ids[row, :len(a["ids"])] = a["ids"]
        mask = np.arange(width)[None] < np.array([len(a["ids"]) for a in answers])[:, None]
        read_ids = read(codec, jnp.asarray(ids), jnp.asarray(mask))
        actions, count, ok, reasoning, stopped = (np.asarray(x) for x in read_ids)
        for row, a in enumerate(answers):
            data = b"".join(table[i] for i in a["ids"])
            assert data.decode("utf-8", errors="replace") == a["text"] == tok.decode(a["ids"])
            expected = parse_answer_text(a["text"], codec.action_names, per_turn)
            assert ([int(x) for x in actions[row, :count[row]]], bool(ok[row])) == expected, a["text"]
            assert int(reasoning[row]) == reference_reasoning(table, a["ids"]), a["text"]
            assert bool(stopped[row]) == reference_stop(table, a["ids"], len(a["ids"])), a["text"]
            valid += expected[1]
    assert valid == samples["meta"]["format_ok"]
