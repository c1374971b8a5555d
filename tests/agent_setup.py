"""Pieces many test files build the same way: an env with its text tables, the tiny model,
and a scripted policy that emits given token ids (a stand-in for a model in the rollout)."""

import jax
import jax.numpy as jnp

from ragen_jax.envs import registry
from ragen_jax.models import hf, sampling
from ragen_jax.models.qwen2 import Qwen2Config, init_model
from ragen_jax.rollout import Policy
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate


def text_parts(env_name: str = "SimpleSokoban", max_actions_per_turn: int = 2):
    """(env, env params, built-in tokenizer, codec, prompt template)."""
    env, params = registry.make(env_name)
    tok = hf.load_tokenizer()
    return (env, params, tok, TextCodec.build(tok, env, max_actions_per_turn),
            PromptTemplate.build(tok, env, max_actions_per_turn))


def tiny_model(seed: int = 0):
    return init_model(Qwen2Config.preset("tiny"), jax.random.key(seed))


class ScriptedPolicy(Policy):
    """Emits tokens[b, turn, :lengths[b, turn]] each turn; prefill and cache do nothing."""

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
