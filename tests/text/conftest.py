"""Tokenizers for the text tests: the built-in one, a second Qwen-style byte BPE trained here
with another vocabulary size and seed, and two real ones (Qwen's, SmolLM2's from its GGUF file;
real_tokenizers.py), so the codec is not tied to one vocabulary or one pre-tokenizer.

`tokenizer` runs a test with all four. A property test that is slow with a 152K vocabulary runs
twice instead: over `small_tokenizer` with many examples, over `real_tokenizer` with fewer.
Codecs, prompt templates and byte tables are built once per session (`codecs`, `prompts`,
`byte_tables`): a real vocabulary makes each build take a second or more."""

import json
import os
import sys

import pytest

from ragen_jax.envs.registry import make
from ragen_jax.models.hf import load_tokenizer
from ragen_jax.text import build_tokenizer
from ragen_jax.text.codec import TextCodec, token_bytes
from ragen_jax.text.prompt import PromptTemplate

# Make the shared helpers (text_helpers.py, real_tokenizers.py) importable by the tests here.
sys.path.insert(0, os.path.dirname(__file__))

import real_tokenizers  # noqa: E402

SMALL = ["builtin", "vocab600"]
REAL = ["qwen", "smollm2"]


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


@pytest.fixture(scope="session")
def qwen_tokenizer():
    return real_tokenizers.qwen_tokenizer()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    return real_tokenizers.smollm2_tokenizer()


@pytest.fixture(scope="session", params=SMALL + REAL)
def tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="session", params=REAL)
def real_tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="session", params=SMALL)
def small_tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")


def _cached(build):
    cache = {}

    def get(tokenizer, *args, **kw):
        key = (id(tokenizer), args, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = build(tokenizer, *args, **kw)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def codecs():
    """(tokenizer, env name, max actions=2, **TextCodec.build options) -> codec."""
    return _cached(lambda tok, name, max_actions=2, **kw: TextCodec.build(tok, make(name)[0], max_actions, **kw))


@pytest.fixture(scope="session")
def prompts():
    """(tokenizer, env name, max actions=2) -> PromptTemplate."""
    return _cached(lambda tok, name, max_actions=2: PromptTemplate.build(tok, make(name)[0], max_actions))


@pytest.fixture(scope="session")
def byte_tables():
    """tokenizer -> `token_bytes(tokenizer)`, the bytes of every id."""
    return _cached(token_bytes)
