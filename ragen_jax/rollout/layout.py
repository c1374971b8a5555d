"""The rollout's token buffer layout: where every turn's observation and generation sit.

Each trajectory owns one fixed buffer (docs/architecture.md#static-shapes-slots-with-holes):

    [system | turn 1 obs (observation) | turn 1 gen (generation) | turn 2 obs | ...]

Every row uses the same static offsets. The rollout writes the buffer in this layout and
returns it with the trajectories, so the update, the diagnostics, the planner and the
rendering of validation episodes read segment positions from it instead of working them out.

This module imports jax only inside `observation_length`: the planner imports it before it
chooses its (fake) devices.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BufferLayout:
    """Static segment lengths of the buffer; hashable, so it can be a static jit argument."""

    system: int  # slots [0, system): the system prompt, the same in every row
    observation: int  # slots per turn for the rendered observation
    generation: int  # slots per turn for the policy's answer (max_new_tokens)
    turns: int

    @property
    def turn_length(self) -> int:
        return self.observation + self.generation

    @property
    def length(self) -> int:
        """Slots in the whole buffer: the last turn's generation ends it."""
        return self.system + self.turns * self.turn_length

    def observation_offset(self, turn: int) -> int:
        return self.system + turn * self.turn_length

    def generation_offset(self, turn: int) -> int:
        return self.observation_offset(turn) + self.observation

    @property
    def generation_offsets(self) -> tuple[int, ...]:
        """Each turn's first generation slot."""
        return tuple(self.generation_offset(t) for t in range(self.turns))

    def observation_slice(self, turn: int) -> slice:
        return slice(self.observation_offset(turn), self.generation_offset(turn))

    def generation_slice(self, turn: int) -> slice:
        return slice(self.generation_offset(turn), self.generation_offset(turn) + self.generation)


def observation_length(env, env_params, codec, prompt) -> int:
    """Static length of a turn's rendered observation (`turn_ids` of the env's state tokens)."""
    import jax
    import jax.numpy as jnp

    from ragen_jax.text.prompt import turn_ids

    def first_observation():
        state = env.reset(jax.random.key(0), env_params)
        return turn_ids(prompt, env.state_tokens(state, env_params, codec), 1, jnp.zeros((), jnp.int32),
                        jnp.zeros(()), jnp.zeros((), bool), jnp.zeros((), bool))

    return jax.eval_shape(first_observation)[0].shape[0]


def buffer_layout(env, env_params, codec, prompt, config) -> BufferLayout:
    """The layout of a rollout of `env` with this text codec, prompt and `RolloutConfig`
    (shapes only: nothing is computed, so it may be called while tracing)."""
    return BufferLayout(system=int(prompt.system_ids.shape[0]),
                        observation=observation_length(env, env_params, codec, prompt),
                        generation=config.max_new_tokens, turns=config.max_turns)
