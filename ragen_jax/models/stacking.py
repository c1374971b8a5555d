"""Layers stacked for a scanned model, and the copy of a model that only runs forward.

A scanned model (`DecoderConfig.scan_layers`) holds one `Block` whose weights are the layers'
stacked on a leading axis; checkpoints and Hugging Face I/O convert between that layout and one
entry per layer. `for_inference` is the model as the rollout, diagnostics and validation run it:
with `DecoderConfig.unroll_inference`, a scanned model's layers unrolled (`unroll`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core.sharding import fit_spec, traced_model_shards
from ragen_jax.models.layers import set_config

if TYPE_CHECKING:
    from ragen_jax.models.decoder import Decoder
    from ragen_jax.models.layers import Block


def stack_blocks(blocks: list[Block]) -> Block:
    """One `Block` whose every weight is the layers' weights stacked on a new leading axis
    (replicated over the mesh: its partition spec gains a leading None)."""
    graph, _ = nnx.split(blocks[0])
    stacked = jax.tree.map(lambda *layers: jnp.stack(layers), *(nnx.state(b) for b in blocks))
    block = nnx.merge(graph, stacked)
    for _, var in nnx.iter_graph(block):
        if isinstance(var, nnx.Variable) and var.has_metadata("out_sharding"):
            var.set_metadata("out_sharding", (None, *var.get_metadata("out_sharding")))
    return block


def unstack_blocks(block: Block, num_layers: int) -> list[Block]:
    """The inverse of `stack_blocks`: one `Block` per layer, each weight layer l's slice of the
    stacked one, its partition spec without the leading None (what an unrolled model declares).
    Adapter settings (scale, dropout, on/off) are the stacked block's. Traced under a mesh that
    splits the model, each slice is constrained to that spec: the layer sharded as the unrolled
    model's would be."""
    graph, stacked = nnx.split(block)
    mesh = jax.sharding.get_abstract_mesh() if traced_model_shards() > 1 else None
    blocks = []
    for i in range(num_layers):
        layer = nnx.merge(graph, jax.tree.map(lambda x: x[i], stacked))
        for _, var in nnx.iter_graph(layer):
            if isinstance(var, nnx.Variable) and var.has_metadata("out_sharding"):
                spec = tuple(var.get_metadata("out_sharding"))[1:]
                var.set_metadata("out_sharding", spec)
                if mesh is not None:
                    value = var[...]
                    var.set_value(jax.lax.with_sharding_constraint(value, fit_spec(value.shape, spec, mesh)))
        blocks.append(layer)
    return blocks


def stacked_layout(tree: dict) -> bool:
    """Whether a model's state as a nested dict (`nnx.to_pure_dict`, an orbax tree) holds its
    layers stacked (a scanned model) rather than one entry per layer (keys 0, 1, … or "0", …)."""
    return not any(str(key).isdigit() for key in tree["layers"])


def stack_layers(tree: dict, stack=jnp.stack) -> dict:
    """A per-layer model state dict in the stacked layout; `stack(list of layer leaves)`."""
    layers = sorted(tree["layers"].items(), key=lambda item: int(item[0]))
    return {**tree, "layers": jax.tree.map(lambda *xs: stack(list(xs)), *(layer for _, layer in layers))}


def unstack_layers(tree: dict, num_layers: int, take=lambda x, i: x[i]) -> dict:
    """A stacked model state dict in the per-layer layout (keys 0 … num_layers − 1); `take(leaf,
    i)` is layer i's slice."""
    return {**tree, "layers": {i: jax.tree.map(lambda x: take(x, i), tree["layers"]) for i in range(num_layers)}}


def unroll(model: Decoder) -> Decoder:
    """A scanned `model` made unrolled in place (and returned): one `Block` per layer sliced from
    the stacked weights (`unstack_blocks`), and `scan_layers` off in its config and its layers',
    so what reads `model.cfg` follows: the forward's Python loop over the layers, the KV caches
    `init_cache(model.cfg, ...)` allocates and the sampler's per-layer decode cache. The
    numbers are the scanned model's, up to the reduction order of the unrolled code paths."""
    model.layers = nnx.List(unstack_blocks(model.layers, model.cfg.num_layers))
    set_config(model, dataclasses.replace(model.cfg, scan_layers=False))
    return model


def for_inference(model: Decoder) -> Decoder:
    """The model as the programs that only run it forward (rollout, diagnostics, validation) use
    it: weights cast to the compute dtype once up front instead of at every use inside their
    loops (the same numbers: every use casts its weight to the compute dtype), and, traced
    under a mesh that splits the model, the embedding/LM head whole on every device: every
    decode step reads all of it, and gathering it inside each turn's decode loop left one
    gathered copy per turn. With `unroll_inference` a scanned model's layers are unrolled
    (`unroll`), the slices taken inside the calling program; training keeps the scan. A copy:
    `model` itself is left as it is."""
    graph, state = nnx.split(model)
    if model.cfg.param_dtype != model.cfg.dtype:
        dtype = jnp.dtype(model.cfg.dtype)
        state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    model = nnx.merge(graph, state)
    if model.cfg.scan_layers and model.cfg.unroll_inference:
        unroll(model)
    if traced_model_shards() > 1:
        whole = lambda v: jax.lax.with_sharding_constraint(v, jax.sharding.PartitionSpec())
        model.embed_tokens.set_value(whole(model.embed_tokens[...]))
        if model.lm_head is not None:
            model.lm_head.set_value(whole(model.lm_head[...]))
    return model
