"""Real checkpoint layouts through the train and export commands: a Llama-family safetensors
directory with SmolLM2's real tokenizer, and a Qwen2.5-shaped one (152K vocabulary) with Qwen's
real tokenizer. The weights are random at tiny widths; the tokenizers, vocabularies, chat
templates and config.json files are the real ones, so the whole path a user takes (loading, the
in-graph prompt and parser over a real vocabulary, the train step, export) runs."""

import json

import pytest
import torch
import transformers

from ragen_jax.cli import export, train
from ragen_jax.models import hf, packaged

from commands import CONFIG, SMALL, records

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            initializer_range=0.05)


def checkpoint(path, model_class, config_class, tokenizer, **fields):
    """A random tiny `model_class` saved with `tokenizer` (its special ids in config.json)."""
    torch.manual_seed(0)
    config = config_class(vocab_size=fields.pop("vocab_size", len(tokenizer)), eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, **TINY, **fields)
    model_class(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    tokenizer = hf.load_tokenizer(packaged.SMOLLM2)
    return checkpoint(tmp_path_factory.mktemp("llama"), transformers.LlamaForCausalLM, transformers.LlamaConfig,
                      tokenizer, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e5})


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    tokenizer = hf.load_tokenizer(packaged.QWEN_TOKENIZER)
    return checkpoint(tmp_path_factory.mktemp("qwen"), transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                      tokenizer, vocab_size=151936, tie_word_embeddings=True)


def run(model_dir, workdir, *extra):
    code = train.main(["--config", CONFIG, "--workdir", str(workdir), f"--config.model.path={model_dir}",
                       "--config.model.preset=None", "--config.model.init=None", "--config.train.steps=2",
                       "--config.train.val_every=2", "--config.rollout.max_new_tokens=16", *SMALL, *extra])
    assert code == 0
    return records(workdir)


def test_llama_directory_with_smollm2_tokenizer_trains_and_exports_as_llama(llama_dir, tmp_path):
    got = run(llama_dir, tmp_path / "run", "--config.model.scan_layers=true")
    assert [r["step"] for r in got] == [0, 1, 2]
    assert "actor/pg_loss" in got[2] and "val/success" in got[2]
    assert export.main(["--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"] and written["attention_bias"] is False
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    text = "# P X O #"
    assert (transformers.AutoTokenizer.from_pretrained(tmp_path / "out").encode(text)
            == hf.load_tokenizer(packaged.SMOLLM2).encode(text))


def test_qwen25_shaped_directory_with_qwens_tokenizer_trains(qwen_dir, tmp_path):
    got = run(qwen_dir, tmp_path / "run", "--config.model.vocab_chunk=16384")
    assert [r["step"] for r in got] == [0, 1, 2]
    assert "actor/pg_loss" in got[2]
