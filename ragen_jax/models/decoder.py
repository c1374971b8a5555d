"""The Qwen2/Qwen2.5 and Llama decoder family in Flax NNX, numerically matching Hugging Face
`Qwen2ForCausalLM` and `LlamaForCausalLM`: one code path, the families differing only in config
fields (`attention_bias`: Qwen2's q/k/v biases; `rope_type`: Llama 3's "llama3" scaling).

The model works on a fixed token buffer with *holes*
(docs/architecture.md#static-shapes-slots-with-holes): every call takes
token ids, per-token RoPE positions and a validity mask. A query slot attends to every valid
key slot at or before it, so masked slots in the middle of a sequence are invisible and the
model sees exactly the contiguous text. The same rule drives the KV cache: a chunk written at
offset `t` attends to the valid cache slots `<= t + i`.

The layers are in `layers.py`, the config in `config.py`, the cache in `cache.py`; the layers
run either scanned over stacked weights or as a Python loop (`DecoderConfig.scan_layers`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core.sharding import FSDP, TENSOR, constrain_rows
from ragen_jax.models.cache import DecodeContext, KVCache
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.cpu_tuning import CpuPath
from ragen_jax.models.layers import Block, LayerInputs, RMSNorm, param, pick_slots, remat
from ragen_jax.models.lora import add_adapters
from ragen_jax.models.rope import rope_tables
from ragen_jax.models.stacking import stack_blocks


class Decoder(nnx.Module):
    """Decoder + LM head. `__call__` returns final-normed hidden states; `logits` projects them."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = param(rngs, (cfg.vocab_size, cfg.hidden_size), cfg, (TENSOR, FSDP))
        blocks = [Block(cfg, rngs) for _ in range(cfg.num_layers)]
        self.layers = stack_blocks(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.norm = RMSNorm(cfg, rngs)
        # Stored [vocab, hidden] like the embedding, so tied and untied heads share code.
        self.lm_head = (None if cfg.tie_word_embeddings else
                        param(rngs, (cfg.vocab_size, cfg.hidden_size), cfg, (TENSOR, FSDP)))
        if cfg.lora.rank:  # drawn after every base weight: the same base as without adapters
            add_adapters(self, rngs.params())

    def __call__(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
                 context: DecodeContext = DecodeContext(), dropout_key: jax.Array | None = None):
        """tokens, positions, mask: [B, T]. Without a cache in `context` the T slots attend among
        themselves; with one the chunk is written at slot `context.offset` and attends to the
        cache. Returns (hidden [B, T, hidden_size] in the compute dtype, cache); with
        `context.query` hidden is [B, 1, hidden_size]. `dropout_key`: a training forward's PRNG
        key for the LoRA dropout (`model.lora.dropout`; ignored at 0 or without adapters)."""
        h = jnp.take(self.embed_tokens[...], tokens, axis=0).astype(jnp.dtype(self.cfg.dtype))
        cache, inputs = self._layer_inputs(positions, mask.astype(bool), context)
        if dropout_key is not None and self.cfg.lora.has_dropout:
            # the update's whole-buffer forward only (a cache-filling forward's row chunks would share masks)
            if context.cache is not None:
                raise ValueError("LoRA dropout applies to a training forward without a KV cache")
            inputs = dataclasses.replace(inputs, dropout_key=dropout_key)
        if self.cfg.scan_layers:
            h, cache = self._scanned(h, cache, inputs)
            # every slot's output computed, then the asked ones picked (one program for all layers)
            h = h if context.query is None else pick_slots(h, context.query)
        else:
            h, cache = self._unrolled(h, cache, inputs, context.query)
        return self.norm(h), cache

    def _layer_inputs(self, positions, mask, context: DecodeContext) -> tuple[KVCache | None, LayerInputs]:
        """The cache with the chunk's slot validity written at `context.offset`, and what every
        layer reads: RoPE tables, the key slots each query slot attends to (valid, at or before
        it), and the call's CPU path."""
        cache, offset, t = context.cache, context.offset, mask.shape[1]
        if context.rope is None:
            cos, sin = rope_tables(self.cfg, positions)
        else:
            cos, sin = (jnp.take(table[0], positions, axis=0) for table in context.rope)
        if cache is None:
            key_valid, key_slot = mask, jnp.arange(t)
        else:
            cache = cache.replace(mask=jax.lax.dynamic_update_slice(cache.mask, mask, (0, offset)))
            end = (context.key_limit if context.key_limit is not None else
                   offset + t if isinstance(offset, int) else cache.length)
            key_valid, key_slot = cache.mask[:, :end], jnp.arange(end)
        query_slot = offset + jnp.arange(t)
        attn_mask = (key_slot[None, :] <= query_slot[:, None])[None] & key_valid[:, None, :]
        return cache, LayerInputs(cos, sin, attn_mask, offset, context.query_block, CpuPath.for_call(context))

    def _unrolled(self, h, cache, inputs: LayerInputs, query):
        """A Python loop over the layers; the last one computes only the `query` slots' outputs."""

        def run(block, h, cache, layer, pick):
            return block(constrain_rows(h), inputs, cache, layer, pick)

        run = remat(self.cfg, run, static_argnums=(3,))
        for layer, block in enumerate(self.layers):
            h, cache = run(block, h, cache, layer, query if layer == len(self.layers) - 1 else None)
        return h, cache

    def _scanned(self, h, cache, inputs: LayerInputs):
        """One block's program run by `lax.scan` over the stacked weights, the cache a loop carry
        written at the traced layer index. A shared cache is only read: each layer gets its
        slice as a scanned input (not a loop carry, which rematerialisation would keep once
        per layer)."""
        graph, stacked = nnx.split(self.layers)
        shared = cache is not None and cache.shared

        def body(carry, xs):
            params, layer, kv = xs
            h, cache_in = carry
            block = nnx.merge(graph, params)
            if shared:
                h, _ = block(constrain_rows(h), inputs, cache.replace(k=kv[0][None], v=kv[1][None]), 0)
                return (h, cache_in), None
            return block(constrain_rows(h), inputs, cache_in, layer), None

        body = remat(self.cfg, body, prevent_cse=False)
        layer_kv = (cache.k, cache.v) if shared else None
        carry = (h, None if shared else cache)
        (h, carried), _ = jax.lax.scan(body, carry, (stacked, jnp.arange(self.cfg.num_layers), layer_kv))
        return h, cache if shared else carried

    def head_weight(self) -> jax.Array:
        return (self.embed_tokens if self.lm_head is None else self.lm_head)[...]

    def logits(self, hidden: jax.Array, vocab_major: bool = False) -> jax.Array:
        """f32 logits for hidden [..., hidden_size]. Only call on the positions you need.
        `vocab_major`: for hidden [..., T, hidden_size] return [..., vocab, T], so that the head's
        weight gradient contracts over T without a transposed copy of the logits (on CPU XLA
        copied every [T, vocab] block for it; see head.token_logprobs)."""
        w = self.head_weight().astype(hidden.dtype)
        spec = "vd,...td->...vt" if vocab_major else "...d,vd->...v"
        operands = (w, hidden) if vocab_major else (hidden, w)
        return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32)


def init_model(cfg: DecoderConfig, key: jax.Array) -> Decoder:
    """A randomly initialised model (normal(0, initializer_range) weights, unit norms)."""
    return Decoder(cfg, rngs=nnx.Rngs(params=key))
