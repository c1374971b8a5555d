"""Checkpoint I/O against transformers: round trip, sharded checkpoints, mesh placement, errors."""

import json
import os
import shutil
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import AxisType, PartitionSpec as P
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

from ragen_jax.models import hf
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model

from hf_reference import VOCAB, hf_logits, make_hf_model

TOL = 1e-4


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(2, 9)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 6:] = False
    return ids, mask


def ours_logits(model, ids, mask):
    mask = jnp.asarray(mask)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(mask), mask)
    return np.asarray(model.logits(hidden))


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_round_trip_through_transformers(hf_models, batch, tmp_path, name):
    torch_model, path = hf_models[name]
    model = hf.load_pretrained(path)
    hf.save_pretrained(model, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"
    assert reloaded.config.tie_word_embeddings == (name == "tied")
    ids, mask = batch
    np.testing.assert_allclose(hf_logits(reloaded, ids, mask), hf_logits(torch_model, ids, mask), atol=1e-6)
    with torch.no_grad():  # every tensor written is the original one
        for key, value in torch_model.state_dict().items():
            np.testing.assert_array_equal(reloaded.state_dict()[key].numpy(), value.numpy())


def test_builtin_tiny_model_exports_and_reloads(tmp_path, batch):
    cfg = DecoderConfig.preset("tiny", rope_theta=777.0)
    model = init_model(cfg, jax.random.key(1))
    hf.save_pretrained(model, tmp_path, max_shard_bytes=400_000, tokenizer=hf.load_tokenizer())
    assert (tmp_path / "model.safetensors.index.json").is_file()
    torch_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch_model.config.rope_parameters["rope_theta"] == 777.0
    ids, mask = batch
    np.testing.assert_allclose(ours_logits(model, ids, mask)[mask], hf_logits(torch_model, ids, mask)[mask],
                               atol=TOL)
    again = hf.load_pretrained(tmp_path)
    assert again.cfg == cfg
    assert hf.load_tokenizer(tmp_path).chat_template == hf.load_tokenizer().chat_template


def test_sharded_checkpoint_with_index(tmp_path, hf_models, batch):
    torch_model = hf_models["untied"][0]
    torch_model.save_pretrained(tmp_path, max_shard_size="60KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    model = hf.load_pretrained(tmp_path)
    ids, mask = batch
    np.testing.assert_allclose(ours_logits(model, ids, mask)[mask], hf_logits(torch_model, ids, mask)[mask],
                               atol=TOL)


def test_load_onto_mesh_of_8_devices(hf_models, batch):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
    torch_model, path = hf_models["untied"]
    model = hf.load_pretrained(path, mesh=mesh)
    q = model.layers[0].self_attn.q_proj.kernel[...]
    assert q.sharding.spec == P("fsdp", "tensor") and len(q.sharding.device_set) == 8
    assert q.addressable_shards[0].data.shape == (16, 32)
    assert model.embed_tokens[...].sharding.spec == P(None, "fsdp")  # vocab 211 is odd: replicated
    assert model.lm_head[...].sharding.spec == P(None, "fsdp")
    assert model.norm.weight[...].sharding.spec == P(None)
    ids, mask = batch
    got = jax.jit(lambda m, i, k: m.logits(m(i, positions_from_mask(k), k)[0]))(
        model, jnp.asarray(ids), jnp.asarray(mask))
    ref = hf_logits(torch_model, ids, mask)
    assert np.abs(np.asarray(got) - ref)[mask].max() <= TOL


def test_bfloat16_checkpoint(tmp_path, batch):
    make_hf_model(tie=True, seed=5).to(torch.bfloat16).save_pretrained(tmp_path)
    model = hf.load_pretrained(tmp_path)  # stored bf16, loaded as f32 params
    assert model.embed_tokens[...].dtype == jnp.float32
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids, mask = batch
    np.testing.assert_allclose(ours_logits(model, ids, mask)[mask], hf_logits(ref_model, ids, mask)[mask],
                               atol=TOL)


def copy_checkpoint(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_errors_are_one_line_and_name_the_problem(tmp_path, hf_models):
    src = hf_models["untied"][1]
    with pytest.raises(FileNotFoundError, match="model directory not found: .*nowhere"):
        hf.load_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        hf.load_pretrained(tmp_path / "empty")

    noweights = copy_checkpoint(src, tmp_path / "noweights")
    (noweights / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no \\*.safetensors weights"):
        hf.load_pretrained(noweights)

    mistral = copy_checkpoint(src, tmp_path / "mistral")
    cfg = json.loads((mistral / "config.json").read_text())
    cfg.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (mistral / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="architecture MistralForCausalLM is not supported"):
        hf.load_pretrained(mistral)

    missing = copy_checkpoint(src, tmp_path / "missing")
    tensors = load_file(missing / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, missing / "model.safetensors")
    with pytest.raises(ValueError, match=r"no tensor lm_head.weight \(expected shape \(211, 64\)\)"):
        hf.load_pretrained(missing)

    bad = copy_checkpoint(src, tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((160, 63), np.float32)
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight has shape \(160, 63\), "
                                         r"expected \(160, 64\)"):
        hf.load_pretrained(bad)


def test_unsupported_checkpoint_settings(tmp_path):
    make_hf_model(tie=True, rope={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="rope_type='dynamic' is not supported"):
        hf.load_pretrained(tmp_path)


@pytest.mark.parametrize("max_shard_bytes", [5 * 2**30, 400_000])  # one file, several with an index
def test_exported_files_get_the_mode_open_gives(tmp_path, max_shard_bytes):
    """safetensors creates its files 0600; the export's files all read as open() makes them."""
    model = init_model(DecoderConfig.preset("tiny"), jax.random.key(3))
    umask = os.umask(0o027)
    try:
        hf.save_pretrained(model, tmp_path, max_shard_bytes=max_shard_bytes, tokenizer=hf.load_tokenizer())
    finally:
        os.umask(umask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_path.iterdir()}
    assert any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {oct(0o640)}, modes


def test_export_interrupted_midway_leaves_nothing_loadable(tmp_path, monkeypatch):
    model = init_model(DecoderConfig.preset("tiny"), jax.random.key(2))
    calls = []

    def failing_save(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full")
        save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(hf, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(model, tmp_path, max_shard_bytes=400_000)
    assert not (tmp_path / "config.json").exists()
    assert not list(tmp_path.glob("*.safetensors"))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        hf.load_pretrained(tmp_path)
