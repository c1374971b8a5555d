"""Two tokenizers for the text tests: the built-in one and a second Qwen-style byte BPE trained
here with another vocabulary size and seed, so the codec is not tied to one vocabulary."""

import json
import os
import sys

import pytest

from ragen_jax.models.hf import load_tokenizer
from ragen_jax.text import build_tokenizer

# Make the shared helpers (text_helpers.py) importable by the tests in this folder.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def builtin_tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def vocab600_tokenizer(tmp_path_factory):
    tok = build_tokenizer.build(vocab_size=600, seed=1, num_conversations=3000)
    path = tmp_path_factory.mktemp("vocab600")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(build_tokenizer.tokenizer_config()))
    loaded = load_tokenizer(path)
    assert len(loaded) == 600
    return loaded


@pytest.fixture(scope="session", params=["builtin", "vocab600"])
def tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")

