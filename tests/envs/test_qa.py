"""QA: the in-graph answer comparison against Python (`re`, `Decimal`), the tensorflow-datasets
builder on generated problems and on user files, and its one-line errors."""

import json
import re
import sys
from decimal import Decimal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ragen_jax.envs import qa_data
from ragen_jax.envs.qa import MAX_ANSWER_BYTES, answers_match, canonical_number

BATCH = 64
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")


def reference_match(answer: str, reference: str) -> bool:
    """The rule in plain Python: normalised texts equal, or both decimal numbers of one value."""
    a, b = qa_data.normalise(answer), qa_data.normalise(reference)
    if a == b:
        return True
    return bool(NUMBER.fullmatch(a) and NUMBER.fullmatch(b)) and Decimal(a) == Decimal(b)


def pad(text: bytes, width=MAX_ANSWER_BYTES):
    out = np.zeros(width, np.uint8)
    out[:len(text)] = list(text)
    return out


@jax.jit
@jax.vmap
def match(answer, length, ref, ref_len, canon, canon_len, is_number):
    return answers_match(answer, length, ref, ref_len, canon, canon_len, is_number)[0]


def in_graph(pairs):
    """answers_match on (answer, reference) string pairs; the reference side tabled as the env does."""
    rows = []
    for answer, reference in pairs + [("", "0")] * (BATCH - len(pairs)):
        norm = qa_data.normalise(reference)
        canon = canonical_number(norm)
        rows.append((pad(answer.encode()), len(answer.encode()), pad(norm.encode()), len(norm.encode()),
                     pad((canon or "").encode()), len((canon or "").encode()), canon is not None))
    arrays = [jnp.asarray(np.stack(col)) for col in zip(*rows)]
    return np.asarray(match(*arrays))[:len(pairs)].tolist()


NUMBERS = ["5", "05", "5.0", "+5", "-5", "5.", ".5", "0.5", "0.50", "-0", "0", "-0.0", "00", "1.25", "12.50", "-.25",
           "1.2.3", "+-5", "5e3", "١٢", "½", "--5", "+.", "."]
WORDS = ["x", "X", "sqrt(2)", "\\frac{1}{2}", "1/2", "3\\sqrt{2}", "Yes", "ＡＢ", "é", "É", "18 dollars", ""]
SPACE = st.sampled_from(["", " ", "\t", "\n", "\u00a0", "\u3000", "  "])
piece = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(WORDS), st.text(alphabet="0123456789.+-aB ", max_size=4))
answer_st = st.builds(lambda a, b, c, d, e: a + b + c + d + e, SPACE, piece, SPACE, st.sampled_from(["", "", "0", "x"]),
                      SPACE)


@settings(max_examples=12, deadline=None)
@given(pairs=st.lists(st.tuples(answer_st, answer_st), min_size=BATCH, max_size=BATCH))
def test_answer_comparison_matches_python(pairs):
    pairs = [(a, b) for a, b in pairs if len(a.encode()) <= MAX_ANSWER_BYTES and len(b.encode()) <= MAX_ANSWER_BYTES]
    assert in_graph(pairs) == [reference_match(a, b) for a, b in pairs]


def test_answer_comparison_examples():
    pairs = [(" 7.50 ", "7.5"), ("+7.5", "07.50"), ("-0", "0.0"), ("7.5", "75"), ("Yes", "yes"), ("1 / 2", "1/2"),
             ("1/2", "0.5"), ("\u3000Ｘ", "ｘ"), ("\\Frac{1}{2}", "\\frac{1}{2}"), ("", "5"), ("5", "5 dollars")]
    got = in_graph(pairs)
    assert got == [reference_match(a, b) for a, b in pairs]
    assert got == [True, True, True, False, True, True, False, False, True, False, False]


# ----------------------------------------------------------------------------- the builder


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    pytest.importorskip("tensorflow_datasets", reason="the QA data tests need: pip install 'ragen-jax[datasets]'")
    return str(tmp_path_factory.mktemp("tfds"))


def test_generated_problems_are_deterministic_and_right(tfds_dir):
    records = qa_data.load_records(num_records=200, seed=3, data_dir=tfds_dir)
    assert sorted(records) == sorted(qa_data.arithmetic_records(200, 3))
    assert records == qa_data.load_records(num_records=200, seed=3, data_dir=tfds_dir)  # prepared once, same order
    assert sorted(records) != sorted(qa_data.arithmetic_records(200, 4))
    for question, answer in records:  # every answer recomputed from its question
        nums = [Decimal(n) for n in re.findall(r"[0-9]+(?:\.[0-9]+)?", question)]
        a, b = nums[0], nums[1]
        if "more" in question:
            want = a + b
        elif "away" in question:
            want = a - b
        elif "rows" in question:
            want = a * b
        elif "equally" in question:
            want = a / b
        else:
            want = a * b
        assert Decimal(answer) == want and canonical_number(answer) is not None, (question, answer)


def test_user_files_jsonl_json_and_parquet(tfds_dir, tmp_path):
    rows = [{"query": "What is 2 + 2?", "response": "Add them.\nThe answer is: 4", "type": "GSM_AnsAug"},
            {"query": "Solve x + 1 = 3.", "response": "x = 2. The answer is: 2 "},
            {"query": "  Half of 3?  ", "response": "The answer is: \\frac{3}{2}"}]
    want = sorted([("What is 2 + 2?", "4"), ("Solve x + 1 = 3.", "2"), ("Half of 3?", "\\frac{3}{2}")])
    jsonl = tmp_path / "meta.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert sorted(qa_data.load_records(path=str(jsonl), data_dir=tfds_dir)) == want
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"question": q, "answer": a} for q, a in want]))
    assert sorted(qa_data.load_records(path=str(plain), data_dir=tfds_dir)) == want
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"query": [r["query"] for r in rows], "response": [r["response"] for r in rows]})
    pq.write_table(table, tmp_path / "meta.parquet")
    assert sorted(qa_data.load_records(path=str(tmp_path / "meta.parquet"), data_dir=tfds_dir)) == want


@pytest.mark.parametrize("name, content, message", [
    ("data.csv", "q,a\n", "has extension '.csv'; allowed: .jsonl, .json, .parquet"),
    ("data.jsonl", '{"question": "q", "answer": "1"}\nnot json\n', "line 2 is not JSON"),
    ("data.jsonl", '{"prompt": "q"}\n', "line 1: a record needs fields question and answer"),
    ("data.jsonl", '{"query": "q", "response": "no mark"}\n', "has no 'The answer is:' line"),
    ("data.json", '{"question": "q"}', "must hold a JSON list"),
    ("data.parquet", "not parquet", "is not a readable parquet file"),
])
def test_bad_files_give_one_line(tfds_dir, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(qa_data.DataError, match=re.escape(message)) as err:
        qa_data.file_records(str(path))
    assert "\n" not in str(err.value)
    with pytest.raises(qa_data.DataError, match="does not exist"):
        qa_data.load_records(path=str(tmp_path / "missing.jsonl"), data_dir=tfds_dir)


def test_without_tensorflow_datasets_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import now raises ImportError
    with pytest.raises(qa_data.DataError, match=re.escape("pip install 'ragen-jax[datasets]'")):
        qa_data.load_records(num_records=5)
