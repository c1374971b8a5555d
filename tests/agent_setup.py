"""Pieces many test files build the same way: an env with its text tables, the tiny model,
and the scripted policy (`rollout.policies.ScriptedPolicy`, a stand-in for a model)."""

import jax
import numpy as np

from ragen_jax.envs import registry
from ragen_jax.models import hf
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rollout.policies import ScriptedPolicy  # noqa: F401  (re-exported for the tests)
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate


def text_parts(env_name: str = "SimpleSokoban", max_actions_per_turn: int = 2, **env_overrides):
    """(env, env params, built-in tokenizer, codec, prompt template); `env_overrides` go to
    `registry.make` (e.g. FrozenLake's success_rate)."""
    env, params = registry.make(env_name, **env_overrides)
    tok = hf.load_tokenizer()
    return (env, params, tok, TextCodec.build(tok, env, max_actions_per_turn),
            PromptTemplate.build(tok, env, max_actions_per_turn))


# Tests that roll out or train the tiny model from random weights give it two layers instead of
# three: still more than one (per-layer caches, sharding rules and adapters see a layer index),
# and a third faster to compile and to run. The shipped warm starts keep all three.
TEST_LAYERS = 2


def tiny_model(seed: int = 0, layers: int | None = None):
    """The built-in tiny model (random weights of `seed`); `layers` instead of its 3 if given."""
    cfg = DecoderConfig.preset("tiny", **({} if layers is None else {"num_layers": layers}))
    return init_model(cfg, jax.random.key(seed))


def step_parts(max_actions_per_turn: int):
    """What a SimpleSokoban `Trainer` takes besides its config: (env, env params, codec, prompt
    template, the tiny model of seed 0 with TEST_LAYERS layers)."""
    env, params, _, codec, prompt = text_parts("SimpleSokoban", max_actions_per_turn)
    return env, params, codec, prompt, tiny_model(0, TEST_LAYERS)


def scripted_texts(tok, texts, config):
    """texts[b][t] (the policy's text for row b, turn t) -> token arrays [B, T, max_new_tokens]
    and lengths [B, T] for a `ScriptedPolicy` under the rollout `config`."""
    tokens = np.zeros((config.batch, config.max_turns, config.max_new_tokens), np.int32)
    lengths = np.zeros((config.batch, config.max_turns), np.int32)
    for b, row in enumerate(texts):
        for t, text in enumerate(row):
            ids = tok.encode(text, add_special_tokens=False)
            assert len(ids) <= config.max_new_tokens, text
            tokens[b, t, :len(ids)], lengths[b, t] = ids, len(ids)
    return tokens, lengths
