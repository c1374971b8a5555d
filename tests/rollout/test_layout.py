"""The buffer layout: offsets by hand, and the observation length the prompt's capacity gives."""

import jax
import pytest

from ragen_jax.rollout.layout import BufferLayout, buffer_layout
from ragen_jax.rollout.play import RolloutConfig

from agent_setup import text_parts

CONFIG = RolloutConfig(num_groups=2, group_size=2, max_turns=3, max_new_tokens=10)


def test_offsets_and_slices():
    layout = BufferLayout(system=5, observation=3, generation=4, turns=2)
    # [system 0-4 | obs 5-7 | gen 8-11 | obs 12-14 | gen 15-18]
    assert (layout.turn_length, layout.length) == (7, 19)
    assert [layout.observation_offset(t) for t in range(2)] == [5, 12]
    assert layout.generation_offsets == (8, 15)
    assert layout.observation_slice(1) == slice(12, 15)
    assert layout.generation_slice(1) == slice(15, 19)
    assert hash(layout) == hash(BufferLayout(5, 3, 4, 2)) and layout == BufferLayout(5, 3, 4, 2)


@pytest.mark.parametrize("env_name", ["SimpleSokoban", "FrozenLake"])
def test_board_observation_length_is_the_prompts_capacity(env_name):
    env, params, _, codec, prompt = text_parts(env_name)
    rows, cols = env.symbol_grid(env.reset(jax.random.key(0), params), params).shape
    assert buffer_layout(env, params, codec, prompt, CONFIG) == BufferLayout(
        system=len(prompt.system_ids), observation=prompt.observation_capacity(codec, rows, cols),
        generation=CONFIG.max_new_tokens, turns=CONFIG.max_turns)
