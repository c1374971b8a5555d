"""GGUF checkpoints (llama.cpp's one-file format) read as a Hugging Face checkpoint: a config.json
dict, tensors in HF names and layout, and a tokenizer, so `hf.load_pretrained` loads a `.gguf`
like a config.json + safetensors directory. `gguf.GGUFReader` parses the file (memory-mapped);
the dequantization is ours, in vectorised NumPy.

A GGUF file holds typed metadata (hyper-parameters under `{arch}.*`, the tokenizer under
`tokenizer.*`) and tensors named llama.cpp's way (`blk.3.attn_q.weight`). ggml lists dimensions
fastest first, so a GGUF shape [in, out] is numpy's [out, in]: HF's Linear layout as it is.

Block layouts. A row is stored in blocks of `block_size` values / `type_size` bytes
(`gguf.GGML_QUANT_SIZES`); scales d/dmin/m are little-endian float16 unless noted.
  F32, F16, BF16 one value per element (BF16: the high half of a float32)
  Q8_0  32 values: d, 32 int8 q                        x = d*q
  Q4_0  32 values: d, 16 bytes of 4-bit q              x = d*(q-8)
  Q4_1  32 values: d, m, 16 bytes of 4-bit q           x = d*q + m
  Q5_0  Q4_0 plus a uint32 of fifth bits               x = d*(q-16)
  Q5_1  Q4_1 plus a uint32 of fifth bits               x = d*q + m
K-quants pack 256 values in sub-blocks whose scales are themselves quantized:
  Q2_K  16x16: a byte per sub-block (4-bit scale, 4-bit min), 2-bit q, d, dmin:  x = d*sc*q - dmin*m
  Q3_K  16x16: 2-bit q, a high-bit mask (bit clear: q-4), 6-bit signed scales, d: x = d*sc*q
  Q4_K  8x32: d, dmin, 6-bit scales and mins packed in 12 bytes, 4-bit q:     x = d*sc*q - dmin*m
  Q5_K  Q4_K plus one high bit per value
  Q6_K  16x16: 4 low and 2 high bits of q, int8 scales, d:                     x = d*sc*(q-32)
Narrow fields are packed in runs of bytes: the k-th field of each byte of a run of R bytes holds
values k*R .. k*R+R-1 of that run's share of the block (`_fields`), e.g. Q4_0 byte j holds value
j in its low nibble and value j+16 in its high one.

Q/K permutation. llama.cpp's converter reorders the rows of every llama q_proj / k_proj weight
and bias, head by head, from HF's rotary layout (dimension j pairs with j + head_dim/2) to the
interleaved one ggml's rope uses (2j pairs with 2j+1): row t*half + j becomes row 2j + t.
`GGUFCheckpoint.array` moves them back, so it returns the HF tensor. Qwen2 files keep HF's
layout (ggml rotates them NeoX-style) and are not permuted.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

# ----------------------------------------------------------------------------- dequantization


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as a float32 column [n, 1]."""
    return blocks[:, at:at + 2].view("<f2").astype(np.float32)


def _fields(packed: np.ndarray, bits: int, run: int) -> np.ndarray:
    """Unpack `bits`-wide fields from [n, bytes] uint8: per run of `run` bytes, field k of byte r
    is value k*run + r of the run; runs follow each other. Returns [n, bytes * 8 // bits] uint8."""
    n = packed.shape[0]
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    fields = (packed.reshape(n, -1, 1, run) >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(n, -1)


def _f32(b):
    return b.view("<f4").astype(np.float32)


def _f16(b):
    return b.view("<f2").astype(np.float32)


def _bf16(b):
    return (b.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.float32) * _half(b, 0)


def _q4_0(b):
    q = _fields(b[:, 2:], 4, 16).astype(np.int8) - np.int8(8)
    return _half(b, 0) * q.astype(np.float32)


def _q4_1(b):
    q = _fields(b[:, 4:], 4, 16).astype(np.float32)
    return _half(b, 0) * q + _half(b, 2)


def _q5_0(b):
    q = _fields(b[:, 6:], 4, 16) | (_fields(b[:, 2:6], 1, 1) << np.uint8(4))
    return _half(b, 0) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def _q5_1(b):
    q = _fields(b[:, 8:], 4, 16) | (_fields(b[:, 4:8], 1, 1) << np.uint8(4))
    return _half(b, 0) * q.astype(np.float32) + _half(b, 2)


def _q2_k(b):
    n = b.shape[0]
    scales, d, dmin = b[:, :16], _half(b, 80), _half(b, 82)
    q = _fields(b[:, 16:80], 2, 32).reshape(n, 16, 16).astype(np.float32)
    sc = (d * (scales & np.uint8(0x0F)).astype(np.float32))[..., None]
    mn = (dmin * (scales >> np.uint8(4)).astype(np.float32))[..., None]
    return (sc * q - mn).reshape(n, 256)


def _q3_k(b):
    n = b.shape[0]
    scales = _fields(b[:, 96:104], 4, 8) | (_fields(b[:, 104:108], 2, 4) << np.uint8(4))
    sc = _half(b, 108) * (scales.astype(np.int8) - np.int8(32)).astype(np.float32)
    offset = (np.uint8(1) - _fields(b[:, :32], 1, 32)) << np.uint8(2)  # 4 where the mask bit is clear
    q = _fields(b[:, 32:96], 2, 32).astype(np.int8) - offset.astype(np.int8)
    return (sc[..., None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 8 six-bit scales and mins from 12 bytes a|b|c (4 each): sub-blocks 0-3 keep
    theirs in the low 6 bits of a (scales) and b (mins); 4-7 in the nibbles of c (low: scale,
    high: min) with the top 2 bits in the free high bits of a and b."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    top = np.uint8(6)
    scales = np.concatenate([a & np.uint8(63), (c & np.uint8(15)) | ((a >> top) << np.uint8(4))], axis=1)
    mins = np.concatenate([b & np.uint8(63), (c >> np.uint8(4)) | ((b >> top) << np.uint8(4))], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_affine(b, q):
    """x = d*sc*q - dmin*m over the 8 sub-blocks of 32 (Q4_K, Q5_K)."""
    n = b.shape[0]
    scales, mins = _k_scales(b[:, 4:16])
    sc, mn = (_half(b, 0) * scales)[..., None], (_half(b, 2) * mins)[..., None]
    return (sc * q.reshape(n, 8, 32).astype(np.float32) - mn).reshape(n, 256)


def _q4_k(b):
    return _k_affine(b, _fields(b[:, 16:144], 4, 32))


def _q5_k(b):
    return _k_affine(b, _fields(b[:, 48:176], 4, 32) | (_fields(b[:, 16:48], 1, 32) << np.uint8(4)))


def _q6_k(b):
    n = b.shape[0]
    q = _fields(b[:, :128], 4, 64) | (_fields(b[:, 128:192], 2, 32) << np.uint8(4))
    q = (q.astype(np.int8) - np.int8(32)).astype(np.float32)
    sc = _half(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)
    return (sc[..., None] * q.reshape(n, 16, 16)).reshape(n, 256)


_KERNELS: dict[QType, Callable[[np.ndarray], np.ndarray]] = {
    QType.F32: _f32, QType.F16: _f16, QType.BF16: _bf16, QType.Q8_0: _q8_0,
    QType.Q4_0: _q4_0, QType.Q4_1: _q4_1, QType.Q5_0: _q5_0, QType.Q5_1: _q5_1,
    QType.Q2_K: _q2_k, QType.Q3_K: _q3_k, QType.Q4_K: _q4_k, QType.Q5_K: _q5_k, QType.Q6_K: _q6_k,
}
SUPPORTED_TYPES = tuple(t.name for t in _KERNELS)
_CHUNK = 1 << 22  # values dequantized at a time: bounds the temporaries on big tensors


def _qtype(qtype) -> QType:
    try:
        return QType(int(qtype))
    except ValueError:
        raise ValueError(f"unknown GGUF tensor type {qtype!r}; supported: {', '.join(SUPPORTED_TYPES)}") from None


def dequantize(raw: np.ndarray, qtype: QType | int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 array of `shape` (numpy order: the GGUF dims reversed) from a tensor's raw bytes
    (any dtype; read as bytes) of GGML type `qtype`. Unsupported types: ValueError naming it."""
    qtype = _qtype(qtype)
    kernel = _KERNELS.get(qtype)
    if kernel is None:
        raise ValueError(f"GGUF tensor type {qtype.name} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    block, size = GGML_QUANT_SIZES[qtype]
    shape = tuple(int(dim) for dim in shape)
    if shape and shape[-1] % block:
        raise ValueError(f"{qtype.name} stores rows in blocks of {block} values; shape {shape} has rows of {shape[-1]}")
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if data.size != math.prod(shape) // block * size:
        raise ValueError(f"a {qtype.name} tensor of shape {shape} takes {math.prod(shape) // block * size} bytes, "
                         f"got {data.size}")
    blocks = data.reshape(-1, size)
    out = np.empty((blocks.shape[0], block), np.float32)
    step = max(1, _CHUNK // block)
    for start in range(0, blocks.shape[0], step):
        out[start:start + step] = kernel(blocks[start:start + step])
    return out.reshape(shape)


# ----------------------------------------------------------------------------- checkpoint

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_PER_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
              "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}
_ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope factors: read into rope_parameters, not a weight
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = ("smollm", "qwen2")  # tokenizer.ggml.pre values `tokenizer()` builds
_REQUIRED = object()


def _hf_name(name: str) -> str | None:
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if match and match[2] in _PER_LAYER:
        return f"model.layers.{match[1]}.{_PER_LAYER[match[2]]}.{match[3]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo the converter's per-head interleave of llama q/k rows (module docstring)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(wavelen, factor, low, high, original):
    """The per-frequency divisors llama.cpp stores as rope_freqs for Llama 3.1's rope scaling."""
    smooth = (original / wavelen - low) / (high - low)
    middle = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, middle))


def _llama3_rope(stored: np.ndarray, theta: float, head_dim: int, original: int) -> dict | None:
    """Llama 3.1's rope scaling recovered from the rope_freqs factors llama.cpp stores for it
    (None when no setting reproduces them). The factors fix `factor`, and through the smoothly
    scaled band low_freq_factor and high_freq_factor relative to `original`, which the file does
    not store: any `original` then gives the same frequencies."""
    stored = np.asarray(stored, np.float64)
    factor = float(stored.max())
    wavelen = 2 * np.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    band = (stored > 1 + 1e-6) & (stored < factor * (1 - 1e-6))
    low, high = 1.0, 4.0  # Llama 3.1's values, when the band is too narrow to fit them
    if band.sum() >= 2:  # smooth = original/(high-low) / wavelen - low/(high-low): a line in 1/wavelen
        smooth = (1 / stored[band] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(1 / wavelen[band], smooth, 1)
        low, high = -intercept * original / slope, (1 - intercept) * original / slope
    factor, low, high = (float(f"{x:.6g}") for x in (factor, low, high))
    if not np.allclose(_llama3_factors(wavelen, factor, low, high, original), stored, rtol=1e-4):
        return None
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": original}


class GGUFCheckpoint:
    """A llama / qwen2 GGUF file as a Hugging Face checkpoint: `hf_config()`, `keys()`,
    `array(name)` (float32, HF layout, dequantized) and `tokenizer()`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        if not self.path.is_file():
            raise ValueError(f"{self.path} is not a GGUF file (not a regular file)")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as e:  # a damaged file fails anywhere in the parse
            first = (str(e).splitlines() or [""])[0]
            raise ValueError(f"{self.path}: unreadable GGUF file ({type(e).__name__}: {first})") from None
        if self.reader.byte_order != "I":
            raise ValueError(f"{self.path}: big-endian GGUF files are not supported")
        self.architecture = self._meta("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{self.path}: GGUF architecture {self.architecture!r} is not supported; "
                             f"supported: {', '.join(ARCHITECTURES)}")
        self._tensors, self._rope_freqs, unknown = {}, None, []
        for tensor in self.reader.tensors:
            name = _hf_name(tensor.name)
            if name is not None:
                self._tensors[name] = tensor
            elif tensor.name == _ROPE_FREQS:
                self._rope_freqs = tensor
            else:
                unknown.append(tensor.name)
        if unknown:
            raise ValueError(f"{self.path}: tensors a {self.architecture} decoder does not have: "
                             f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")

    def _meta(self, key: str, default=_REQUIRED):
        """A metadata value; float32 ones as their shortest decimal (1e-05, not 9.99999974e-06)."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise ValueError(f"{self.path}: GGUF metadata has no {key}")
            return default
        value = field.contents()
        if field.types == [gguf.GGUFValueType.FLOAT32]:
            value = float(str(np.float32(value)))
        return value

    def _arch_meta(self, key: str, default=_REQUIRED):
        return self._meta(f"{self.architecture}.{key}", default)

    def hf_config(self) -> dict:
        """The config.json transformers would have for this model."""
        hidden, heads = self._arch_meta("embedding_length"), self._arch_meta("attention.head_count")
        head_dim = self._arch_meta("attention.key_length", hidden // heads)
        rotary = self._arch_meta("rope.dimension_count", head_dim)
        if rotary != head_dim:
            raise ValueError(f"{self.path}: rope over {rotary} of {head_dim} head dimensions is not supported")
        config = {
            "architectures": [ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self._vocab_size(),
            "hidden_size": hidden,
            "intermediate_size": self._arch_meta("feed_forward_length"),
            "num_hidden_layers": self._arch_meta("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self._arch_meta("attention.head_count_kv", heads),
            "head_dim": head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self._arch_meta("attention.layer_norm_rms_epsilon"),
            "max_position_embeddings": self._arch_meta("context_length"),
            "rope_parameters": self._rope_parameters(head_dim),
            # llama.cpp writes output.weight only when it is not the embedding
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "attention_bias": "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            "bos_token_id": self._meta("tokenizer.ggml.bos_token_id", None),
            "eos_token_id": self._meta("tokenizer.ggml.eos_token_id", None),
            "pad_token_id": self._meta("tokenizer.ggml.padding_token_id", None),
        }
        config.update({"mlp_bias": False} if self.architecture == "llama" else {"use_sliding_window": False})
        return config

    def _vocab_size(self) -> int:
        """The embedding's rows; a vocab-only file (no tensors) states the size or lists the tokens."""
        embedding = self._tensors.get("model.embed_tokens.weight")
        if embedding is not None:
            return int(embedding.shape[1])  # GGUF dims: [hidden, vocab]
        size = self._arch_meta("vocab_size", None)
        return size if size is not None else len(self._meta("tokenizer.ggml.tokens"))

    def _rope_parameters(self, head_dim: int) -> dict:
        """HF rope_parameters from `{arch}.rope.*`; llama.cpp states Llama 3's scaling only as the
        rope_freqs tensor, from which `_llama3_rope` recovers it."""
        rope = {"rope_type": "default", "rope_theta": self._arch_meta("rope.freq_base", 10000.0)}
        kind = self._arch_meta("rope.scaling.type", None)
        if kind is None and self._arch_meta("rope.scale_linear", None) is not None:  # older files
            return rope | {"rope_type": "linear", "factor": self._arch_meta("rope.scale_linear")}
        freqs = None if self._rope_freqs is None else np.asarray(self._rope_freqs.data, np.float64)
        if freqs is not None and not np.allclose(freqs, 1.0):
            original = self._arch_meta("rope.scaling.original_context_length", 8192)
            llama3 = _llama3_rope(freqs, rope["rope_theta"], head_dim, original) if kind in (None, "none") else None
            if llama3 is None:
                raise ValueError(f"{self.path}: {_ROPE_FREQS} (with rope scaling {kind or 'none'}) matches no Llama 3 "
                                 "rope scaling; supported: rope scaling none, linear, yarn, or llama3 rope_freqs")
            return rope | llama3
        if kind in (None, "none"):
            return rope
        if kind not in ("linear", "yarn"):
            raise ValueError(f"{self.path}: rope scaling {kind!r} is not supported; "
                             "supported: none, linear, yarn, llama3")
        rope |= {"rope_type": kind, "factor": self._arch_meta("rope.scaling.factor")}
        if kind == "yarn":
            for key, name in (("original_context_length", "original_max_position_embeddings"),
                              ("attn_factor", "attention_factor"), ("yarn_beta_fast", "beta_fast"),
                              ("yarn_beta_slow", "beta_slow")):
                value = self._arch_meta(f"rope.scaling.{key}", None)
                if value is not None:
                    rope[name] = value
        return rope

    def keys(self) -> list[str]:
        """The Hugging Face names of the tensors in the file (lm_head.weight only when untied)."""
        return list(self._tensors)

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` (a Hugging Face name) as float32 in HF layout, dequantized; llama q/k
        rows moved back from llama.cpp's rotary order."""
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ValueError(f"{self.path}: no tensor {name!r} (it has {len(self._tensors)}, e.g. "
                             f"{', '.join(list(self._tensors)[:3])})")
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        try:
            values = dequantize(tensor.data, tensor.tensor_type, shape)
        except ValueError as e:
            raise ValueError(f"{self.path}: tensor {tensor.name}: {e}") from None
        if self.architecture == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = self._arch_meta("attention.head_count")
            if ".k_proj." in name:
                heads = self._arch_meta("attention.head_count_kv", heads)
            values = _unpermute(values, heads)
        return values

    def tokenizer(self):
        """A transformers `PreTrainedTokenizerFast` built from the metadata: byte-level BPE on the
        file's vocabulary and merges, the pre-tokenizer `tokenizer.ggml.pre` names, control tokens
        as special added tokens and user-defined ones as (non-special) added tokens, the bos/eos/
        unk/pad ids, the chat template and add_bos_token."""
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        model = self._meta("tokenizer.ggml.model", None)
        if model != "gpt2":
            raise ValueError(f"{self.path}: tokenizer model {model!r} is not supported; supported: 'gpt2' "
                             "(byte-level BPE)")
        pre = self._meta("tokenizer.ggml.pre", None)
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"{self.path}: pre-tokenizer {pre!r} is not supported; supported: "
                             f"{', '.join(PRE_TOKENIZERS)}")
        tokens = self._meta("tokenizer.ggml.tokens")
        types = self._meta("tokenizer.ggml.token_type", [gguf.TokenType.NORMAL] * len(tokens))
        merges = [tuple(merge.split(" ")) for merge in self._meta("tokenizer.ggml.merges")]
        backend = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges))
        if pre == "smollm":  # llama.cpp: each digit alone, then GPT-2's split
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        else:  # qwen2: Qwen2's own split, and its NFC normalizer
            backend.normalizer = normalizers.NFC()
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                    for token, kind in zip(tokens, types) if kind == gguf.TokenType.CONTROL])
        backend.add_tokens([AddedToken(token, special=False, normalized=False)
                            for token, kind in zip(tokens, types) if kind == gguf.TokenType.USER_DEFINED])

        special = {}
        for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                          ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
            index = self._meta(f"tokenizer.ggml.{key}", None)
            if index is not None and 0 <= index < len(tokens):
                special[name] = tokens[index]
        # transformers builds the post-processor (bos/eos added or not) from add_bos/eos_token
        add_bos = bool(self._meta("tokenizer.ggml.add_bos_token", False)) and "bos_token" in special
        add_eos = bool(self._meta("tokenizer.ggml.add_eos_token", False)) and "eos_token" in special
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, **special, chat_template=self._meta("tokenizer.chat_template", None),
            add_bos_token=add_bos, add_eos_token=add_eos, clean_up_tokenization_spaces=False,
            model_max_length=self._arch_meta("context_length", int(1e30)))  # 1e30: transformers' "no limit"
