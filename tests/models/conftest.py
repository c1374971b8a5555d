"""Tiny random transformers Qwen2 checkpoints, built once per session and saved to disk."""

import pytest
from hf_reference import make_hf_model


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
