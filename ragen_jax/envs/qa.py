"""Dataset-backed single-question QA (MetaMathQA-style) as a pure-JAX environment.

The records (question, answer) are loaded on the host (`qa_data.load_records`: a local file
through a tensorflow-datasets builder, or generated arithmetic word problems) and tokenized
once when the text tables are built (`text_tables`): every question as the token ids of its
text plus a newline, every answer in its comparison form. In the graph an episode is a
question index drawn by `reset`; the observation gathers that question's ids; `step_text`
compares the `<answer>` text with the record's answer:

- both are normalised: whitespace removed (Python's `\\s`), ASCII letters lower-cased;
- they are equal when the normalised texts are equal, or when both are decimal numbers
  (`[+-]?(digits[.digits] | .digits)`, e.g. "5", "+5.0", "05", ".5") of the same value —
  compared exactly, digit by digit (sign, integer part without leading zeros, fraction
  without trailing zeros), never as floats;
- a correct answer at attempt k (0-based) pays 1/2^k and ends the episode (RAGEN's
  MetaMathQA reward); a wrong one pays 0 and the next turn is attempt k + 1, until
  `max_attempts`; an empty or overlong answer is not a valid answer (format penalty).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.envs import qa_data
from ragen_jax.envs.base import Info, TextAnswerEnvironment
from ragen_jax.text.codec import _whitespace, pack

MAX_ANSWER_BYTES = 64
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")  # a decimal number, after normalisation


@struct.dataclass
class QAParams:
    """Static settings; `num_questions` comes from the loaded records."""

    num_questions: int = struct.field(pytree_node=False, default=1)
    max_attempts: int = struct.field(pytree_node=False, default=1)

    def __post_init__(self):
        if self.num_questions < 1:
            raise ValueError(f"num_questions={self.num_questions} must be >= 1")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} must be >= 1")


@struct.dataclass
class QAState:
    index: jax.Array  # int32: the question
    attempt: jax.Array  # int32: valid answers given so far
    done: jax.Array
    success: jax.Array


def canonical_number(text: str) -> str | None:
    """The digit-by-digit canonical form of a normalised decimal number, None if it is not one."""
    if not NUMBER.fullmatch(text):
        return None
    negative = text.startswith("-")
    body = text.lstrip("+-")
    whole, _, frac = body.partition(".")
    whole, frac = whole.lstrip("0"), frac.rstrip("0")
    sign = "-" if negative and (whole or frac) else ""
    return sign + whole + ("." + frac if frac else "")


# ----------------------------------------------------------------------------- in JAX


def normalise_bytes(text: jax.Array, length):
    """`qa_data.normalise` on UTF-8 bytes: (bytes uint8[n], length), valid first."""
    _, covered = _whitespace(text, length)
    keep = (jnp.arange(text.shape[0]) < length) & ~covered
    lowered = jnp.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text).astype(jnp.uint8)
    out, mask = pack(lowered, keep)
    return out, mask.sum().astype(jnp.int32)


def canonical_bytes(text: jax.Array, length):
    """`canonical_number` in JAX: (bytes uint8[n], length, is_number)."""
    n = text.shape[0]
    idx = jnp.arange(n)
    inside = idx < length
    signed = (length > 0) & ((text[0] == ord("+")) | (text[0] == ord("-")))
    negative = signed & (text[0] == ord("-"))
    body = inside & ~(signed & (idx == 0))
    digit = (text >= ord("0")) & (text <= ord("9"))
    dot = text == ord(".")
    is_number = jnp.all(~body | digit | dot) & (jnp.sum(body & dot) <= 1) & jnp.any(body & digit)
    dot_at = jnp.where(jnp.any(body & dot), jnp.argmax(body & dot), length)
    whole = body & digit & (idx < dot_at)
    frac = body & digit & (idx > dot_at)
    first_nonzero = jnp.min(jnp.where(whole & (text != ord("0")), idx, n))
    last_nonzero = jnp.max(jnp.where(frac & (text != ord("0")), idx, -1))
    whole = whole & (idx >= first_nonzero)
    frac = frac & (idx <= last_nonzero)
    nonzero = jnp.any(whole) | jnp.any(frac)
    # [sign] + whole digits + ["." + fraction digits]
    values = jnp.concatenate([jnp.array([ord("-")], jnp.uint8), text.astype(jnp.uint8)])
    keep = jnp.concatenate([jnp.stack([negative & nonzero]), whole | (dot & (idx == dot_at) & jnp.any(frac)) | frac])
    out, mask = pack(values, keep, n)
    return out, mask.sum().astype(jnp.int32), is_number


def _equal(a, la, b, lb):
    width = min(a.shape[0], b.shape[0])
    same = jnp.where(jnp.arange(width) < la, a[:width] == b[:width], True)
    return (la == lb) & jnp.all(same)


def answers_match(answer: jax.Array, length, reference: jax.Array, reference_length, reference_canonical,
                  canonical_length, reference_is_number):
    """The comparison rule of the module docstring; the reference side comes precomputed."""
    text, size = normalise_bytes(answer, length)
    canon, canon_size, is_number = canonical_bytes(text, size)
    same_text = _equal(text, size, reference, reference_length)
    same_number = is_number & reference_is_number & _equal(canon, canon_size, reference_canonical, canonical_length)
    return same_text | same_number, size


# ----------------------------------------------------------------------------- the environment


class QA(TextAnswerEnvironment):
    """One dataset's QA task; `make_qa` builds it from the data settings."""

    max_answer_bytes = MAX_ANSWER_BYTES
    render_formats = ("text",)

    def __init__(self, records: list[tuple[str, str]], name: str = "MathQA", max_question_tokens: int = 256):
        self.name = name
        self.records = list(records)
        self.max_question_tokens = max_question_tokens

    def __repr__(self):
        return f"QA({self.name}, {len(self.records)} records)"

    def default_params(self) -> QAParams:
        return QAParams(num_questions=len(self.records))

    def reset(self, key, params: QAParams) -> QAState:
        index = jax.random.randint(key, (), 0, params.num_questions)
        return QAState(index=index.astype(jnp.int32), attempt=jnp.int32(0), done=jnp.array(False),
                       success=jnp.array(False))

    def step(self, key, state, action, params):
        raise TypeError("QA reads its answer as text: call step_text (answer_kind = 'text')")

    def step_text(self, key, state: QAState, answer, length, params: QAParams, tables):
        i = state.index
        correct, size = answers_match(answer, length, tables["qa_answer"][i], tables["qa_answer_len"][i],
                                      tables["qa_canonical"][i], tables["qa_canonical_len"][i],
                                      tables["qa_is_number"][i])
        valid = size > 0
        live = ~state.done & valid
        win = live & correct
        reward = jnp.where(win, 0.5 ** state.attempt.astype(jnp.float32), 0.0).astype(jnp.float32)
        attempt = state.attempt + live
        new = state.replace(attempt=attempt, success=state.success | win,
                            done=state.done | win | (attempt >= params.max_attempts))
        info: Info = {"success": new.success, "action_is_valid": valid, "action_is_effective": live,
                      "truncated": live & ~win & new.done}
        return new, reward, new.done, info

    def instructions(self) -> str:
        return ("You are solving a math word problem. Think it through, then give only the final answer, "
                "like <answer> 42 </answer>.")

    # ------------------------------------------------------------------ text

    def render_text(self, state: QAState, params: QAParams, fmt: str = "text") -> str:
        if fmt not in self.render_formats:
            raise ValueError(f"render format {fmt!r} is not supported by {self.name}; allowed: {self.render_formats}")
        return self.records[int(state.index)][0]

    def boundary_samples(self) -> list[str]:
        return [q for q, _ in self.records[:8]]

    def text_tables(self, tokenizer, params=None) -> dict:
        return _tables(self, tokenizer)

    def state_tokens(self, state: QAState, params: QAParams, codec):
        t = codec.env_tables
        ids = t["qa_question"][state.index]
        return ids, jnp.arange(ids.shape[0]) < t["qa_question_len"][state.index]


def _tables(env: QA, tokenizer) -> dict:
    questions = [q + "\n" for q, _ in env.records]
    ids = tokenizer(questions, add_special_tokens=False)["input_ids"]
    longest = max(map(len, ids))
    if longest > env.max_question_tokens:
        count = sum(len(x) > env.max_question_tokens for x in ids)
        raise ValueError(f"{count} questions of {env.name} are longer than max_question_tokens="
                         f"{env.max_question_tokens} tokens (the longest has {longest}); raise it or drop them")
    width = MAX_ANSWER_BYTES
    answers = np.zeros((len(ids), width), np.uint8)
    canon = np.zeros((len(ids), width), np.uint8)
    answer_len, canon_len = np.zeros(len(ids), np.int32), np.zeros(len(ids), np.int32)
    is_number = np.zeros(len(ids), bool)
    for i, (_, answer) in enumerate(env.records):
        norm = qa_data.normalise(answer).encode()
        c = canonical_number(qa_data.normalise(answer))
        answers[i, :len(norm)], answer_len[i] = list(norm), len(norm)
        if c is not None:
            canon[i, :len(c)], canon_len[i], is_number[i] = list(c.encode()), len(c), True
    questions_table = np.zeros((len(ids), longest), np.int32)
    for i, x in enumerate(ids):
        questions_table[i, :len(x)] = x
    return {"qa_question": jnp.asarray(questions_table), "qa_question_len": jnp.asarray([len(x) for x in ids], jnp.int32),
            "qa_answer": jnp.asarray(answers), "qa_answer_len": jnp.asarray(answer_len),
            "qa_canonical": jnp.asarray(canon), "qa_canonical_len": jnp.asarray(canon_len),
            "qa_is_number": jnp.asarray(is_number)}


@functools.lru_cache(maxsize=8)
def make_qa(data_path: str = "", data_dir: str = "", num_records: int = 1000, seed: int = 0, max_attempts: int = 1,
            max_question_tokens: int = 256) -> tuple[QA, QAParams]:
    """The QA environment of a data file (`data_path`) or of `num_records` generated arithmetic
    problems; records whose normalised answer is empty or longer than the answer limit are dropped."""
    records = qa_data.load_records(path=data_path, num_records=num_records, seed=seed, data_dir=data_dir)
    usable = [(q, a) for q, a in records if q and 0 < len(qa_data.normalise(a).encode()) <= MAX_ANSWER_BYTES]
    if not usable:
        raise qa_data.DataError(f"no usable records in {data_path or 'the generated problems'} (a question and an "
                                f"answer of 1..{MAX_ANSWER_BYTES} bytes without whitespace are needed)")
    env = QA(usable, "MathQA", max_question_tokens)
    return env, QAParams(num_questions=len(usable), max_attempts=max_attempts)
