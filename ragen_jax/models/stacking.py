"""Layers stacked for a scanned model, and the copy of a model that only runs forward.

A scanned model (`DecoderConfig.scan_layers`) holds one `Block` whose weights are the layers'
stacked on a leading axis; checkpoints and Hugging Face I/O convert between that layout and one
entry per layer. `for_inference` is the model as the rollout, diagnostics and validation run it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core.sharding import traced_model_shards

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


def for_inference(model: Decoder) -> Decoder:
    """The model as the programs that only run it forward (rollout, diagnostics, validation) use
    it: weights cast to the compute dtype once up front instead of at every use inside their
    loops (the same numbers: every use casts its weight to the compute dtype), and, traced
    under a mesh that splits the model, the embedding/LM head whole on every device: every
    decode step reads all of it, and gathering it inside each turn's decode loop left one
    gathered copy per turn."""
    graph, state = nnx.split(model)
    if model.cfg.param_dtype != model.cfg.dtype:
        dtype = jnp.dtype(model.cfg.dtype)
        state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    model = nnx.merge(graph, state)
    if traced_model_shards() > 1:
        whole = lambda v: jax.lax.with_sharding_constraint(v, jax.sharding.PartitionSpec())
        model.embed_tokens.set_value(whole(model.embed_tokens[...]))
        if model.lm_head is not None:
            model.lm_head.set_value(whole(model.lm_head[...]))
    return model
