"""LoRA: low-rank adapters on the decoder's projections (`DecoderConfig.lora`, `model.lora.*`).

Each targeted `layers.Linear` gains `lora_a` [in, rank] and `lora_b` [rank, out] (`LoRAParam`,
a distinct `nnx.Param` type; a scanned model's stacked on the layer axis) and computes
x W + b + (alpha / rank) · (x A) B. A is drawn like peft's default (kaiming-uniform:
U(±1/sqrt(in))), B is zero: an adapted model starts as its base exactly. The adapters are drawn
after every base weight (their own key), so a model with adapters has the same base weights as
the model without them from the same key, and layer l's adapter is the same whether the layers
are scanned or not.

`lora.dropout` > 0 (peft's lora_dropout): the actor's and critic's loss forwards in the update
(rl/update.py) read x through inverted dropout in each adapter, (alpha / rank) · (drop(x) A) B,
the masks drawn from the forward's PRNG key folded with the layer index, then the projection's
index in LORA_TARGETS (`layers.LayerInputs.lora_key`: the same masks scanned or unrolled). Every
other forward (rollout, old log-probs, reference, diagnostics, validation, export) gets no key
and runs without dropout.

Training a LoRA model updates the adapters only (`trainable` / `split_trainable`: the policy's
adapters; the critic's adapters and its value head); the base weights pass through the step
unchanged, so `add_adapters` stores them in the compute dtype (`model.dtype`; every layer casts
its weights to it at use, so the outputs are the same) while the adapters keep `param_dtype`. The base model is the same weights with the adapters switched off (`adapters_off`,
a flag on each adapted layer, no second copy): the KL reference of a LoRA run. `merged` folds
the adapters into the kernels (export), `peft_state` writes them in peft's layout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.models.config import LORA_TARGETS, DecoderConfig, LoraConfig
from ragen_jax.models.layers import Linear, LoRAParam, set_config

__all__ = ["LoRAParam", "add_adapters", "adapters_off", "adapted", "merged", "trainable", "split_trainable",
           "join", "peft_tensors", "peft_config"]


def adapted(cfg: DecoderConfig) -> bool:
    return cfg.lora.rank > 0


def _targets(layers, names: tuple[str, ...]):
    """(layer index or None (stacked), projection name, Linear) of the targeted projections."""
    for path, node in nnx.iter_graph(layers):
        if isinstance(node, Linear) and path and path[-1] in names:
            layer = int(path[0]) if str(path[0]).isdigit() else None
            yield layer, path[-1], node


def add_adapters(model, key: jax.Array, lora: LoraConfig | None = None) -> None:
    """Give `model` (a `Decoder`) adapters on its `lora.targets` (default: its config's), in
    place; with a `lora` given, the model's config (and its layers') becomes that one. Layer l's
    projection `name` draws its A from fold_in(fold_in(key, l), index of name)."""
    if lora is not None:
        set_config(model, dataclasses.replace(model.cfg, lora=lora))
    lora = model.cfg.lora
    if not lora.rank:
        return
    frozen = jnp.dtype(model.cfg.dtype)  # the base weights, frozen from here on: in the compute dtype
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param) and not isinstance(var, LoRAParam) and var.dtype != frozen:
            var.set_value(var[...].astype(frozen))
    dtype = jnp.dtype(model.cfg.param_dtype)
    for layer, name, linear in list(_targets(model.layers, lora.target_names())):
        d_in = linear.kernel.shape[-2]
        bound = 1.0 / d_in ** 0.5  # peft's kaiming_uniform_(a=sqrt(5)) of a [rank, in] weight
        draw = lambda i: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, i), LORA_TARGETS.index(name)),
                                            (d_in, lora.rank), jnp.float32, -bound, bound)
        # a stacked projection (layer None): layer l's slice drawn as the unrolled layer l's
        a = jnp.stack([draw(i) for i in range(model.cfg.num_layers)]) if layer is None else draw(layer)
        linear.add_adapter(a, lora.alpha, dtype, lora.dropout)


def adapters_off(model):
    """`model` (a Decoder or ValueModel, e.g. just merged from a graph and state) with every
    adapter switched off, in place: the base model's outputs from the same weights. Returns it."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, Linear) and hasattr(node, "lora_on"):
            node.lora_on = False
    return model


def adapter_count(cfg: DecoderConfig) -> int:
    """How many adapter weights `cfg.lora` adds (0 without adapters)."""
    if not cfg.lora.rank:
        return 0
    d, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
              "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}
    return cfg.num_layers * cfg.lora.rank * sum(sum(shapes[n]) for n in cfg.lora.target_names())


# ----------------------------------------------------------------------------- what trains

# The critic's head trains with its adapters (its backbone's base weights stay frozen).
_TRAINABLE = nnx.Any(LoRAParam, nnx.PathContains("value_head"))


def trainable(state: nnx.State) -> nnx.State:
    """The part of a policy's or critic's state a LoRA run trains: the adapters (and a critic's
    value head)."""
    return nnx.filter_state(state, _TRAINABLE)


def split_trainable(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(trainable, frozen) parts of a state; `join` puts them back together."""
    return nnx.split_state(state, _TRAINABLE, ...)


def join(train: nnx.State, frozen: nnx.State) -> nnx.State:
    return nnx.merge_state(frozen, train)


# ----------------------------------------------------------------------------- export


def merged(model):
    """A `Decoder` without adapters whose kernels are `model`'s with its adapters folded in
    (W + alpha / rank · A B, in float32), every weight in `param_dtype` (the frozen base weights
    are kept in the compute dtype); `model` itself when it has none."""
    if not adapted(model.cfg):
        return model
    cfg = model.cfg.base()
    out = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))  # the same class, no adapters
    dtype = jnp.dtype(cfg.param_dtype)
    kernels = {}
    for layer, name, linear in _targets(model.layers, LORA_TARGETS):
        kernels[(layer, name)] = linear.merged_kernel().astype(dtype)
    state = nnx.state(model, nnx.Not(LoRAParam))
    nnx.update(out, jax.tree.map(lambda x: x.astype(dtype), state))
    for layer, name, linear in _targets(out.layers, LORA_TARGETS):
        linear.kernel.set_value(kernels[(layer, name)])
    return out


def peft_config(cfg: DecoderConfig, base: str | None = None) -> dict:
    """adapter_config.json of peft's LoRA for `cfg.lora`."""
    lora = cfg.lora
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": lora.rank,
            "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": list(lora.target_names()),
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
            "use_rslora": False, "modules_to_save": None}


def peft_tensors(model, to_host=None) -> dict:
    """peft's adapter_model.safetensors of `model`'s adapters: {"base_model.model.model.layers.
    {l}.{self_attn|mlp}.{name}.lora_A.weight": [rank, in], "…lora_B.weight": [out, rank]}
    (torch's [out, in] order: our A [in, r] and B [r, out] transposed), host numpy arrays."""
    import numpy as np

    to_host = to_host or (lambda a: np.asarray(jax.device_get(a)))
    out = {}
    for layer, name, linear in _targets(model.layers, model.cfg.lora.target_names()):
        if not hasattr(linear, "lora_a"):
            continue
        a, b = to_host(linear.lora_a[...]), to_host(linear.lora_b[...])
        module = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        for i in (range(model.cfg.num_layers) if layer is None else (layer,)):
            ai, bi = (a[i], b[i]) if layer is None else (a, b)
            prefix = f"base_model.model.model.layers.{i}.{module}.{name}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(ai.T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(bi.T)
    return out
