"""Policies the rollout plays: what the loop needs from one (`Policy`), the model's
(`ModelPolicy`, built by `model_policy`) and a scripted one (`ScriptedPolicy`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from ragen_jax.models import sampling
from ragen_jax.models.cache import init_cache
from ragen_jax.models.decoder import Decoder
from ragen_jax.rollout.play import RolloutConfig, RowPart
from ragen_jax.text.codec import TextCodec, action_starts_next, ends_with_answer_close
from ragen_jax.text.prompt import PromptTemplate


class Policy:
    """What the loop needs from a policy: prefill text into its cache, decode a turn.

    `ModelPolicy` is the real one; tests swap in scripted ones with the same two methods.
    """

    def init_cache(self, batch: int, length: int) -> Any:
        raise NotImplementedError

    def prefill(self, cache, tokens, mask, offset, prev_logits):
        raise NotImplementedError

    def decode(self, cache, logits, offset, key, done, turn) -> tuple[Any, sampling.DecodeOutput]:
        raise NotImplementedError


class ScriptedPolicy(Policy):
    """Writes given token ids: tokens[b, turn, :lengths[b, turn]] each turn (demonstrations for
    the supervised warm start, and a stand-in for a model in tests). No cache, no model."""

    def __init__(self, tokens, lengths):
        self.tokens, self.lengths = jnp.asarray(tokens), jnp.asarray(lengths)

    def init_cache(self, batch, length):
        return jnp.zeros(())

    def prefill(self, cache, tokens, mask, offset, prev_logits):
        return cache, jnp.zeros((tokens.shape[0], 1)) if prev_logits is None else prev_logits

    def decode(self, cache, logits, offset, key, done, turn):
        lengths = jnp.where(done, 0, self.lengths[:, turn])
        tokens = jnp.where(jnp.arange(self.tokens.shape[2]) < lengths[:, None], self.tokens[:, turn], 0)
        return cache, sampling.DecodeOutput(tokens=tokens, logprobs=jnp.zeros(tokens.shape, jnp.float32),
                                            lengths=lengths, done=done, logits=logits)


@dataclasses.dataclass(frozen=True)
class ModelPolicy(Policy):
    model: Decoder
    max_new_tokens: int
    params: sampling.SamplingParams
    eos_ids: tuple[int, ...]
    stop_fn: Callable
    action_params: sampling.SamplingParams | None = None  # where `action_fn` says an action starts
    action_fn: Callable | None = None
    part: RowPart | None = None  # the rows it plays of a data-parallel rollout (None: all)

    def init_cache(self, batch, length):
        return init_cache(self.model.cfg, batch, length)

    def prefill(self, cache, tokens, mask, offset, prev_logits):
        return sampling.prefill(self.model, cache, tokens, mask, offset, prev_logits)

    def decode(self, cache, logits, offset, key, done, turn):
        part = self.part or RowPart.whole(logits.shape[0])
        uniforms = part.take(sampling.draw_uniforms(key, self.max_new_tokens, part.total, self.params,
                                                    self.action_params), axis=1)
        return sampling.decode(self.model, cache, logits, offset, key, num_steps=self.max_new_tokens,
                               params=self.params, eos_ids=self.eos_ids, stop_fn=self.stop_fn, done=done,
                               key_limit=offset + self.max_new_tokens, switch_fn=self.action_fn,
                               switch_params=self.action_params, uniforms=uniforms)


def model_policy(model: Decoder, codec: TextCodec, prompt: PromptTemplate, config: RolloutConfig,
                 part: RowPart | None = None) -> ModelPolicy:
    """Sampling from `model`, stopping at `</answer>` or at the chat's end-of-message token
    (and, with `config.action_sampling`, drawing each action's first token with it); `part`:
    the rows it plays of a data-parallel rollout (the same part as the rollout's)."""
    end_of_message = [prompt.end_of_message_id] if prompt.end_of_message_id >= 0 else []
    eos = tuple(sorted({*model.cfg.eos_token_ids, *end_of_message}))
    switch = config.action_sampling is not None
    return ModelPolicy(model, config.max_new_tokens, config.sampling, eos,
                       lambda tokens, lengths: ends_with_answer_close(codec, tokens, lengths),
                       config.action_sampling,
                       (lambda tokens, lengths: action_starts_next(codec, tokens, lengths)) if switch else None,
                       part)
