"""Hugging Face checkpoint I/O for the decoder family (`Qwen2ForCausalLM`, `LlamaForCausalLM`):
config.json + safetensors <-> `Decoder`, and tokenizers. A checkpoint is read as a config.json
dict and a tensor source (`.keys()`, `.array(name)` in Hugging Face names and layout): a
directory's safetensors, or a `.gguf` file through `gguf.GGUFCheckpoint`; `pkg:PACKAGE/FILE`
names a file shipped in an installed package (`packaged.resolve`), and a Hugging Face Hub id
(`org/name`, not a local path) the snapshot directory in the Hub cache (`hub.resolve`).

Loading builds the abstract model with `nnx.eval_shape` and places each weight directly with
its sharding: every device shard is read from the checkpoint on its own, so no full
second copy of the model is ever held (one tensor at most, when a weight is replicated).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from ragen_jax.models import hub, packaged
from ragen_jax.core.sharding import fit_spec
from ragen_jax.models.config import ARCHITECTURES, DecoderConfig
from ragen_jax.models.decoder import Decoder

BUILTIN_TOKENIZER = str(Path(__file__).resolve().parent.parent / "text" / "assets")
_INDEX = "model.safetensors.index.json"
# Hugging Face class -> its config.json model_type (config.ARCHITECTURES, in the same order)
MODEL_TYPES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
assert tuple(MODEL_TYPES) == ARCHITECTURES


# ----------------------------------------------------------------------------- config


def config_from_hf(hf: dict, source: str = "config.json", **overrides) -> DecoderConfig:
    """Our config from a Hugging Face config.json dict (transformers 4 or 5 layout) of a
    `Qwen2ForCausalLM` or `LlamaForCausalLM`. Anything this decoder would compute differently
    (another architecture, MLP biases, sliding-window attention, another activation, partial
    RoPE) is refused with a one-line ValueError naming `source`. `overrides` replace fields."""
    supported = ", ".join(ARCHITECTURES)
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if archs:
        arch = archs[0]
    else:  # no architectures: the model_type says which class transformers would build
        arch = next((a for a, t in MODEL_TYPES.items() if t == model_type), model_type or "unknown")
    if arch not in MODEL_TYPES:
        raise ValueError(f"{source}: architecture {', '.join(archs) or arch} is not supported; supported: {supported}")
    if model_type is not None and model_type != MODEL_TYPES[arch]:
        raise ValueError(f"{source}: architecture {arch} with model_type={model_type!r} is not supported; "
                         f"supported: {', '.join(f'{a} (model_type {t!r})' for a, t in MODEL_TYPES.items())}")

    def refuse(setting: str, want: str):
        raise ValueError(f"{source}: {arch} with {setting} is not supported; supported: {want}")

    llama = arch == "LlamaForCausalLM"
    if hf.get("hidden_act", "silu") != "silu":
        refuse(f"hidden_act={hf['hidden_act']!r}", "hidden_act='silu'")
    if hf.get("mlp_bias"):
        refuse("mlp_bias=true", "MLPs without biases")
    if llama and hf.get("attention_bias"):
        refuse("attention_bias=true", "attention without biases (q/k/v/o biases are not implemented)")
    window = hf.get("sliding_window")
    if window is not None and (llama or hf.get("use_sliding_window")):
        key = "sliding_window" if llama else "use_sliding_window=true, sliding_window"
        refuse(f"{key}={window}", "full attention in every layer")
    if "sliding_attention" in (hf.get("layer_types") or ()):
        refuse("layer_types with 'sliding_attention'", "full attention in every layer")
    # transformers 5 keeps theta and scaling in rope_parameters; 4.x used rope_theta/rope_scaling.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    partial = rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        refuse(f"partial_rotary_factor={partial}", "RoPE over the whole head (partial_rotary_factor 1)")
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    eos = hf.get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    fields = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or 0, rope_theta=float(theta), rope_type=rope_type,
        rope_scaling=tuple(sorted(rope.items())), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos, pad_token_id=hf.get("pad_token_id"),
        initializer_range=hf.get("initializer_range", 0.02),
        architecture=arch, attention_bias=not llama,
    )
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(DecoderConfig)})
    if unknown:
        raise ValueError(f"{source}: {', '.join(unknown)} is not a DecoderConfig field")
    fields.update(overrides)
    return DecoderConfig(**fields)


def config_to_hf(cfg: DecoderConfig, dtype: str) -> dict:
    """config.json contents that transformers 5 (and 4.x, via rope_theta) read as the class the
    weights came from (`cfg.architecture`)."""
    llama = cfg.architecture == "LlamaForCausalLM"
    if cfg.attention_bias == llama:  # transformers' class would add or drop q/k/v biases
        raise ValueError(f"{cfg.architecture} with attention_bias={cfg.attention_bias} cannot be exported; "
                         f"supported: Qwen2ForCausalLM with q/k/v biases, LlamaForCausalLM without")
    eos = list(cfg.eos_token_ids)
    family = ({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1} if llama else
              {"use_sliding_window": False})
    return {
        "architectures": [cfg.architecture], "model_type": MODEL_TYPES[cfg.architecture], "dtype": dtype,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta,
                            **dict(cfg.rope_scaling)},
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_word_embeddings, **family,
        "attention_dropout": 0.0, "initializer_range": cfg.initializer_range, "use_cache": True,
        "bos_token_id": cfg.bos_token_id, "pad_token_id": cfg.pad_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    }


# ----------------------------------------------------------------------------- names


def hf_name(path: tuple) -> tuple[str, bool]:
    """Hugging Face tensor name of one of our parameter paths, and whether to transpose.

    Our names mirror transformers' module tree; only kernels differ ([in, out] vs [out, in]).
    """
    parts = [str(p) for p in path]
    if parts == ["lm_head"]:
        return "lm_head.weight", False
    leaf = parts[-1]
    if leaf == "kernel":
        return "model." + ".".join(parts[:-1]) + ".weight", True
    if parts == ["embed_tokens"]:
        return "model.embed_tokens.weight", False
    return "model." + ".".join(parts), False  # norms' weight, projections' bias


# ----------------------------------------------------------------------------- loading


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether `path` names a GGUF checkpoint file (by its `.gguf` suffix; it need not exist)."""
    return os.fspath(path).lower().endswith(".gguf")


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    return json.loads(cfg_file.read_text())


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_}


class SafetensorsFile:
    """Memory-mapped safetensors reader. numpy's safetensors backend cannot read bfloat16,
    and a memory map lets each device shard be read without loading the whole tensor."""

    def __init__(self, file: Path):
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self.file, self.header, self.start = file, header, 8 + n
        self.data = np.memmap(file, dtype=np.uint8, mode="r")

    def keys(self):
        return self.header.keys()

    def array(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{self.file}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = self.data[self.start + begin:self.start + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the index json when the checkpoint is sharded."""
    index = path / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights (nor {_INDEX})")
    names = {}
    for file in files:
        names.update({name: file for name in SafetensorsFile(file).keys()})
    return names


class SafetensorsCheckpoint:
    """A directory's tensors (one safetensors file, or several listed in the index json) by
    Hugging Face name; each file is opened (memory-mapped) when first read."""

    def __init__(self, path: Path):
        self.files = _weight_files(path)
        self.readers: dict[Path, SafetensorsFile] = {}

    def keys(self) -> list[str]:
        return list(self.files)

    def array(self, name: str) -> np.ndarray:
        file = self.files[name]
        if file not in self.readers:
            if not file.is_file():
                raise FileNotFoundError(f"{file} (listed in {_INDEX}) does not exist")
            self.readers[file] = SafetensorsFile(file)
        if name not in self.readers[file].keys():
            raise ValueError(f"{file}: has no tensor {name} (listed in {_INDEX})")
        return self.readers[file].array(name)


def open_checkpoint(path: str | os.PathLike) -> tuple[dict, Any, str]:
    """(config.json dict, tensor source, what to name in errors) of a checkpoint: a Hugging Face
    directory (config.json + safetensors), a `.gguf` file, `pkg:PACKAGE/FILE` naming either, or a
    Hub id (`org/name`, fetched into the Hub cache: `hub.resolve`).
    The source has `.keys()` (Hugging Face tensor names) and `.array(name)` (Hugging Face layout)."""
    path = packaged.resolve(hub.resolve(path))
    if is_gguf(path):
        checkpoint = _gguf(path)
        return checkpoint.hf_config(), checkpoint, str(path)
    return _read_config(path), SafetensorsCheckpoint(path), str(path / "config.json")


def _gguf(path: Path):
    """The GGUF file at `path` (imported here: the `gguf` package is needed only for such files)."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    from ragen_jax.models.gguf import GGUFCheckpoint

    return GGUFCheckpoint(path)


def load_pretrained(path: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, **overrides) -> Decoder:
    """A `Decoder` from a checkpoint: a Hugging Face directory (config.json + safetensors), a
    `.gguf` file, `pkg:PACKAGE/FILE` naming one shipped in an installed package, or a Hub id
    (`org/name`: its snapshot in the Hub cache, fetched when missing).

    With a mesh every weight is created directly with its sharding (each device reads only
    its shard); without one it goes to the default device. `overrides` replace `DecoderConfig`
    fields of the checkpoint's config (dtype, param_dtype, remat, remat_policy, scan_layers,
    vocab_chunk, …); one given as None keeps the checkpoint's (or DecoderConfig's) value. With
    `scan_layers` the per-layer tensors are stacked into the scanned model's [num_layers, ...]
    weights as they are read.
    """
    hf_config, source, where = open_checkpoint(path)
    overrides = {key: value for key, value in overrides.items() if value is not None}
    adapters = overrides.pop("lora", None)  # LoRA adapters go on after the base weights are read
    cfg = config_from_hf(hf_config, where, **overrides)
    names = set(source.keys())
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    specs = nnx.to_flat_state(nnx.get_partition_spec(state))
    loaded, used = [], set()

    def tensor(name, want_hf):
        if name not in names:
            raise ValueError(f"{path}: checkpoint has no tensor {name} (expected shape {want_hf})")
        found = source.array(name)
        if tuple(found.shape) != want_hf:
            raise ValueError(f"{path}: tensor {name} has shape {tuple(found.shape)}, expected {want_hf}")
        used.add(name)
        return found

    for (p, var), (_, spec) in zip(nnx.to_flat_state(state), specs):
        want = tuple(var.shape)
        if stacked_param(cfg, p):  # one tensor per layer, stacked on axis 0
            per_layer = [hf_name(layer_path(p, i)) for i in range(cfg.num_layers)]
            transpose = per_layer[0][1]
            want_hf = want[1:][::-1] if transpose else want[1:]
            sources = [tensor(name, want_hf) for name, _ in per_layer]
        else:
            name, transpose = hf_name(p)
            sources = tensor(name, want[::-1] if transpose else want)
        value = _place(sources, want, transpose, var.dtype, spec.get_value(), mesh)
        loaded.append((p, var.replace(value)))
    # a bias the model has no place for would silently change its outputs
    unused = sorted(name for name in names - used if name.endswith(".bias"))
    if unused:
        raise ValueError(f"{path}: a {cfg.architecture} with attention_bias={cfg.attention_bias} has no place for "
                         f"tensor {unused[0]}" + (f" (and {len(unused) - 1} more biases)" if len(unused) > 1 else ""))
    model = nnx.merge(graphdef, nnx.from_flat_state(loaded))
    if adapters is not None and adapters.rank:
        from ragen_jax.models.lora import add_adapters

        add_adapters(model, jax.random.key(0), adapters)  # fresh adapters (B = 0): the base's outputs
        if mesh is not None:
            from ragen_jax.core.sharding import shard_model

            model = shard_model(model, mesh)
    return model


def save_adapters(model: Decoder, path: str | os.PathLike, base: str | None = None) -> None:
    """A LoRA model's adapters in peft's layout: adapter_config.json (`base`: the base model it
    names) and adapter_model.safetensors (`lora.peft_tensors`: A [rank, in], B [out, rank]).
    Every process must call this; only process 0 writes."""
    from ragen_jax.core.distributed import is_lead, to_host
    from ragen_jax.core.files import usual_mode
    from ragen_jax.models.lora import peft_config, peft_tensors

    if not model.cfg.lora.rank:
        raise ValueError("the model has no LoRA adapters (model.lora.rank is 0): nothing to write")
    tensors = peft_tensors(model, lambda a: np.asarray(to_host(a), np.float32))
    if not is_lead():
        return
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors.partial"), metadata={"format": "pt"})
    usual_mode(path / "adapter_model.safetensors.partial")
    (path / "adapter_config.json.partial").write_text(json.dumps(peft_config(model.cfg, base), indent=2))
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        os.replace(path / (name + ".partial"), path / name)


def stacked_param(cfg: DecoderConfig, path: tuple) -> bool:
    """Whether the parameter at `path` holds every layer's weight (a scanned model's layers)."""
    return cfg.scan_layers and str(path[0]) == "layers"


def layer_path(path: tuple, layer: int) -> tuple:
    """The per-layer model's path of layer `layer`'s slice of a stacked parameter."""
    return (path[0], layer, *path[1:])


def _place(source, shape, transpose, dtype, spec, mesh):
    """Read one tensor, or a list of per-layer tensors stacked on axis 0 (or only each
    device's shard of it) and put it on device(s)."""

    def read_one(tensor, index):
        src = index[::-1] if transpose else index
        block = tensor[src]
        return np.ascontiguousarray(block.T if transpose else block).astype(dtype)

    def read(index):
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        if not isinstance(source, list):
            return read_one(source, index)
        layers = range(len(source))[index[0]]
        return np.stack([read_one(source[i], index[1:]) for i in layers])

    if mesh is None:
        return jax.device_put(read(()))
    sharding = jax.sharding.NamedSharding(mesh, fit_spec(shape, spec, mesh))
    return jax.make_array_from_callback(shape, sharding, read)


def load_tokenizer(path: str | os.PathLike = BUILTIN_TOKENIZER):
    """transformers' tokenizer of a checkpoint (chat template included): a directory
    (AutoTokenizer), a `.gguf` file (its embedded vocabulary), `pkg:PACKAGE/FILE` naming one, or
    a Hub id (`org/name`: its snapshot in the Hub cache, fetched when missing).

    The default is the project's built-in byte-level BPE tokenizer (ragen_jax/text/assets).
    """
    path = packaged.resolve(hub.resolve(path))
    if is_gguf(path):
        return _gguf(path).tokenizer()
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    if not (path / "tokenizer.json").is_file() and not (path / "vocab.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


# ----------------------------------------------------------------------------- saving


def save_pretrained(model: Decoder, path: str | os.PathLike, *, dtype: str | None = None,
                    max_shard_bytes: int = 5 * 2**30, tokenizer=None) -> None:
    """Write config.json + safetensors (sharded with an index past max_shard_bytes) that
    `transformers.AutoModelForCausalLM.from_pretrained` loads. Tensors are gathered to the
    host one file's worth at a time. Under several processes every process must call this
    (weights sharded across processes are gathered collectively); only process 0 writes.
    A model with LoRA adapters is written merged (W + alpha / rank · A B, `lora.merged`)."""
    from ragen_jax.models.lora import merged

    model = merged(model)
    from ragen_jax.core.distributed import is_lead, to_host
    from ragen_jax.core.files import usual_mode

    lead = is_lead()
    path = Path(path)
    if lead:
        path.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    dtype = jnp.dtype(dtype or cfg.param_dtype)
    # Every file is written under a temporary name and renamed into place at the end, the
    # config last: a crash mid-export never leaves a directory that looks loadable.
    written: list[str] = []

    def partial(name: str) -> str:
        written.append(name)
        return str(path / (name + ".partial"))

    # (parameter, layer or None, transpose) under each Hugging Face name: a scanned model's
    # stacked weights are written one tensor per layer
    entries = []
    for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        layers = range(cfg.num_layers) if stacked_param(cfg, p) else (None,)
        entries += [(*hf_name(p if i is None else layer_path(p, i)), var, i) for i in layers]
    groups, current, size = [], {}, 0
    for name, transpose, var, layer in entries:
        nbytes = int(np.prod(var.shape[0 if layer is None else 1:])) * dtype.itemsize
        if current and size + nbytes > max_shard_bytes:
            groups.append(current)
            current, size = {}, 0
        current[name] = (var, layer, transpose)
        size += nbytes
    groups.append(current)
    gathered = {}  # a stacked weight is gathered to the host once, for all of its layers

    def host(var, layer, transpose):
        key = id(var)
        if key not in gathered:
            gathered.clear()
            gathered[key] = to_host(var[...]).astype(dtype)
        array = gathered[key] if layer is None else gathered[key][layer]
        return np.ascontiguousarray(array.T if transpose else array)

    if len(groups) == 1:
        tensors = {n: host(*vt) for n, vt in groups[0].items()}
        if lead:
            save_file(tensors, partial("model.safetensors"), metadata={"format": "pt"})
            usual_mode(path / "model.safetensors.partial")  # safetensors creates it 0600
    else:
        weight_map, total = {}, 0
        for i, group in enumerate(groups):
            file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            tensors = {n: host(*vt) for n, vt in group.items()}
            total += sum(t.nbytes for t in tensors.values())
            if lead:
                save_file(tensors, partial(file), metadata={"format": "pt"})
                usual_mode(path / (file + ".partial"))
            weight_map.update({n: file for n in group})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        if lead:
            Path(partial(_INDEX)).write_text(json.dumps(index, indent=2))
    if not lead:
        return
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    Path(partial("config.json")).write_text(json.dumps(config_to_hf(cfg, str(dtype)), indent=2))
    for name in written:
        os.replace(path / (name + ".partial"), path / name)

