"""Auto-reset from a pool: every finished episode gets a fresh, never-used one at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.envs.autoreset import AutoReset
from ragen_jax.envs.base import Environment
from ragen_jax.envs.sokoban import SIMPLE_SOKOBAN, SOKOBAN


@struct.dataclass
class Episode:
    uid: jax.Array  # a random 62-bit-ish identity, so reuse of an episode would show
    step_count: jax.Array
    done: jax.Array


class FinishOnRequest(Environment):
    """Action 1 ends the episode, anything else continues it."""

    name = "finish_on_request"
    action_names = ("Finish", "Wait")

    def reset(self, key, params):
        return Episode(uid=jax.random.bits(key, (2,), jnp.uint32), step_count=jnp.int32(0), done=jnp.bool_(False))

    def step(self, key, state, action, params):
        done = state.done | (action == 1)
        new = state.replace(step_count=state.step_count + 1, done=done)
        return new, jnp.float32(0), done, {}


_TOY = {}


def _compiled_toy(batch, refill):
    if (batch, refill) not in _TOY:
        auto = AutoReset(FinishOnRequest(), None, batch=batch, refill=refill)
        _TOY[batch, refill] = jax.jit(auto.init), jax.jit(auto.step)
    return _TOY[batch, refill]


@settings(max_examples=20, deadline=None)
@given(
    batch=st.sampled_from([1, 6]),
    refill=st.sampled_from([1, 4, 9]),
    finish=st.lists(st.lists(st.booleans(), min_size=9, max_size=9), min_size=1, max_size=8),
)
def test_each_finished_env_gets_a_fresh_unused_episode(batch, refill, finish):
    init, step = _compiled_toy(batch, refill)
    carry = init(jax.random.key(0))
    seen = {tuple(u) for u in np.asarray(carry.envs.uid)}
    for row in finish:
        before = np.asarray(carry.envs.uid)
        actions = jnp.where(jnp.asarray(row[:batch]), 1, 2)
        carry, _, dones, _ = step(carry, actions)
        after = np.asarray(carry.envs.uid)
        dones = np.asarray(dones)
        np.testing.assert_array_equal(dones, np.asarray(row[:batch]))
        assert not bool(carry.envs.done.any())
        np.testing.assert_array_equal(after[~dones], before[~dones])
        for uid in map(tuple, after[dones]):
            assert uid not in seen, "a pool episode was handed out twice"
            seen.add(uid)
        assert int(carry.num_fresh) >= batch
        assert np.all(np.asarray(carry.envs.step_count)[dones] == 0)


def test_sokoban_auto_reset_is_deterministic():
    params = SIMPLE_SOKOBAN.replace(max_steps=5)
    auto = AutoReset(SOKOBAN, params, batch=256, refill=128)
    init, step = jax.jit(auto.init), jax.jit(auto.step)

    def run(seed):
        carry = init(jax.random.key(seed))
        first = np.asarray(carry.envs.room_state)
        ever_done = np.zeros(256, bool)
        for t in range(5):
            actions = jax.random.randint(jax.random.key(100 + t), (256,), 1, 5)
            carry, rewards, dones, _ = step(carry, actions)
            assert rewards.shape == (256,) and not bool(carry.envs.done.any())
            ever_done |= np.asarray(dones)
        assert ever_done.all(), "every first episode ended by max_steps=5"
        return first, carry

    first, carry = run(0)
    fresh = np.asarray(carry.envs.room_state)
    assert (fresh != first).any(axis=(1, 2)).mean() > 0.95, "new levels, not the old ones"
    _, again = run(0)
    np.testing.assert_array_equal(jax.random.key_data(carry.key), jax.random.key_data(again.key))
    for a, b in zip(jax.tree.leaves(carry.replace(key=0)), jax.tree.leaves(again.replace(key=0))):
        np.testing.assert_array_equal(a, b)


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="batch=0 and refill=4 must both be >= 1"):
        AutoReset(SOKOBAN, SIMPLE_SOKOBAN, batch=0, refill=4)
