"""The built-in tokenizer: loads like a checkpoint's, pre-tokenizes like Decoder, chat template."""

import json

import pytest
import regex
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from ragen_jax.models.hf import BUILTIN_TOKENIZER, load_tokenizer
from ragen_jax.models.config import PRESETS
from ragen_jax.text import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def raw():
    return Tokenizer.from_file(f"{BUILTIN_TOKENIZER}/tokenizer.json")


def test_loads_through_auto_tokenizer_with_specials(tok):
    assert len(tok) == PRESETS["tiny"].vocab_size == PRESETS["small"].vocab_size == 1024
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [0, 1, 2]
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0
    assert set(PRESETS["tiny"].eos_token_ids) == {0, 2}


def test_pre_tokenizer_is_qwen2s(raw):
    spec = json.loads(raw.to_str())["pre_tokenizer"]
    split, byte_level = spec["pretokenizers"]
    assert split["pattern"]["Regex"] == PRETOKENIZE_REGEX
    assert split["behavior"] == "Isolated" and byte_level["type"] == "ByteLevel"
    assert byte_level["use_regex"] is False


def test_board_cells_are_their_own_pre_tokens(raw):
    pieces = [p for p, _ in raw.pre_tokenizer.pre_tokenize_str("# # #\n# P _")]
    assert pieces == ["#", "Ġ#", "Ġ#Ċ", "#", "ĠP", "Ġ_"]  # docs/architecture.md#text-in-the-graph


SYMBOLS = ["#", "_", "O", "X", "√", "P", "S", "G"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from(SYMBOLS), min_size=2, max_size=8), min_size=1, max_size=8))
def test_board_encoding_is_piecewise_and_matches_qwen2_regex(board):
    """Encoding a rendered board equals concatenating per-cell pieces (a leading space or
    not, the symbol, a trailing newline or not), and the pre-tokens are what Qwen2's regex
    gives in Python."""
    raw = Tokenizer.from_file(f"{BUILTIN_TOKENIZER}/tokenizer.json")
    text = "\n".join(" ".join(row) for row in board)
    pieces = []
    for r, row in enumerate(board):
        for c, sym in enumerate(row):
            last_col, last_row = c == len(row) - 1, r == len(board) - 1
            newline = last_col and not last_row
            piece = (" " if c else "") + sym
            if newline and not sym.isalpha():
                piece += "\n"
            pieces.append(piece)
            if newline and sym.isalpha():
                pieces.append("\n")
    assert regex.findall(PRETOKENIZE_REGEX, text) == pieces
    piecewise = [i for piece in pieces for i in raw.encode(piece).ids]
    assert raw.encode(text).ids == piecewise
    assert raw.decode(raw.encode(text).ids) == text


def test_auto_tokenizer_equals_raw_and_round_trips(tok, raw):
    for text in list(build_tokenizer.corpus(30, seed=123)) + ["Turn 3:\nState:\n# P X O #"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text).ids
        assert tok.decode(ids) == text
    answer = "<think> The box is below me, push it down. </think> <answer> Down || Right </answer>"
    ids = tok.encode(answer, add_special_tokens=False)
    assert len(ids) < len(answer) / 2  # the BPE learnt the project's vocabulary


def test_chat_template_is_qwen2_style(tok):
    messages = [{"role": "system", "content": "You're a helpful assistant. "},
                {"role": "user", "content": "Turn 1:\nState:\n# P #"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou're a helpful assistant. <|im_end|>\n"
                    "<|im_start|>user\nTurn 1:\nState:\n# P #<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 2
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text[: -len("<|im_start|>assistant\n")]


def test_build_script_is_deterministic_and_validates(tmp_path):
    with pytest.raises(SystemExit):
        build_tokenizer.main(["--out", str(tmp_path), "--vocab-size", "100"])
    a = list(build_tokenizer.corpus(5, seed=1))
    assert a == list(build_tokenizer.corpus(5, seed=1)) and a != list(build_tokenizer.corpus(5, seed=2))
    assert any("√" in t for t in build_tokenizer.corpus(200, seed=0))
