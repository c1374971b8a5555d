"""Tiny random transformers Qwen2 and Llama checkpoints, built once per session and saved to disk."""

import numpy as np
import pytest
from hf_reference import VOCAB, make_hf_llama, make_hf_model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """name -> (transformers model, saved directory)."""
    specs = {
        "tied": dict(tie=True),
        "untied": dict(tie=False, seed=1),
        "theta": dict(tie=True, seed=2, rope={"rope_type": "default", "rope_theta": 123.0}),
    }
    out = {}
    for name, kw in specs.items():
        model = make_hf_model(**kw)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (model, path)
    return out


@pytest.fixture(scope="session")
def llama_models(tmp_path_factory):
    """name -> (transformers LlamaForCausalLM, saved directory): tied and untied embeddings."""
    out = {}
    for name, kw in {"tied": dict(tie=True, seed=10), "untied": dict(tie=False, seed=11)}.items():
        model = make_hf_llama(**kw)
        path = tmp_path_factory.mktemp("llama_" + name)
        model.save_pretrained(path)
        out[name] = (model, path)
    return out


@pytest.fixture(scope="module")
def batch():
    """Four rows of random ids with right, left and almost-all padding (a file may define its own)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(4, 13)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 9:] = False  # right padding
    mask[2, :4] = False  # left padding
    mask[3, 5:] = False  # almost all padding
    return ids, mask
