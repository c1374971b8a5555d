"""FrozenLake against gymnasium's own transition table and trajectories, rendering, limits, invariants."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS, FrozenLakeEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.envs.frozenlake import FROZENLAKE, FrozenLakeParams, generate_map
from ragen_jax.envs.solver import solve_frozenlake

DESC_4X4 = tuple(MAPS["4x4"])
SAMPLES = 4000  # draws per (state, action)


def _state_at(params, cell):
    holes, start, goal = generate_map(jax.random.key(0), params)
    state = FROZENLAKE.state_from_map(holes, start, goal)
    return state.replace(player=jnp.asarray(cell, jnp.int32))


@pytest.fixture(scope="module")
def step():
    return jax.jit(FROZENLAKE.step, static_argnums=3)


@pytest.fixture(scope="module")
def sample_next_states():
    """next-state counts of SAMPLES steps from every cell under every action, in one jit call."""

    @jax.jit(static_argnums=1)
    def run(key, params):
        size = params.size
        cells = jnp.stack(jnp.meshgrid(jnp.arange(size), jnp.arange(size), indexing="ij"), -1).reshape(-1, 2)

        def one(key, cell, action):
            state, reward, done, _ = FROZENLAKE.step(key, _state_at(params, cell), action, params)
            return state.player[0] * size + state.player[1], reward, done

        def per_pair(key, cell, action):
            return jax.vmap(one, in_axes=(0, None, None))(jax.random.split(key, SAMPLES), cell, action)

        grid_cells = jnp.repeat(cells, 4, axis=0)
        grid_actions = jnp.tile(jnp.arange(1, 5), size * size)
        keys = jax.random.split(key, grid_cells.shape[0])
        nxt, rew, done = jax.vmap(per_pair)(keys, grid_cells, grid_actions)
        return nxt.reshape(size * size, 4, SAMPLES), rew.reshape(size * size, 4, SAMPLES), done.reshape(size * size, 4, SAMPLES)

    return run


@pytest.mark.parametrize("success_rate", [1.0 / 3.0, 0.7])
def test_transition_frequencies_match_gymnasium_table(sample_next_states, success_rate):
    params = FrozenLakeParams(desc=DESC_4X4, success_rate=success_rate)
    ref = FrozenLakeEnv(desc=list(DESC_4X4), is_slippery=True, success_rate=success_rate)
    nxt, rew, done = (np.asarray(a) for a in sample_next_states(jax.random.key(1), params))
    letters = "".join(DESC_4X4)
    for s in range(16):
        if letters[s] in "GH":
            continue  # gymnasium's absorbing states; our episode has already ended there
        for a in range(4):
            expected = collections.defaultdict(float)
            outcome = {}
            for prob, s2, r, term in ref.P[s][a]:
                expected[s2] += prob
                outcome[s2] = (r, term)
            counts = np.bincount(nxt[s, a], minlength=16)
            for s2 in range(16):
                p = expected.get(s2, 0.0)
                freq = counts[s2] / SAMPLES
                se = np.sqrt(max(p * (1 - p), 1e-12) / SAMPLES)
                assert abs(freq - p) <= 4 * se + 1e-9, (s, a, s2, freq, p)
                if counts[s2]:
                    r, term = outcome[s2]
                    hit = nxt[s, a] == s2
                    assert np.all(rew[s, a][hit] == r) and np.all(done[s, a][hit] == term), (s, a, s2)


def test_deterministic_trajectories_equal_gymnasium(step):
    params = FrozenLakeParams(desc=DESC_4X4, success_rate=1.0, max_steps=1000)
    ref = FrozenLakeEnv(desc=list(DESC_4X4), is_slippery=False)
    rng = np.random.default_rng(0)
    start = FROZENLAKE.reset(jax.random.key(0), params)
    for episode in range(200):
        ref_state, _ = ref.reset(seed=episode)
        state = start
        for t, action in enumerate(rng.integers(0, 4, size=30)):
            ref_state, ref_reward, terminated, _, _ = ref.step(int(action))
            state, reward, done, info = step(jax.random.key(t), state, int(action) + 1, params)
            assert int(state.player[0]) * 4 + int(state.player[1]) == ref_state
            assert float(reward) == ref_reward and bool(done) == terminated
            assert bool(info["success"]) == (ref_reward == 1)
            if terminated:
                break


def test_solver_plan_reaches_the_goal_on_generated_maps(step):
    params = FrozenLakeParams(size=6, success_rate=1.0)
    starts = jax.jit(FROZENLAKE.reset_batch, static_argnums=1)(jax.random.split(jax.random.key(5), 20), params)
    for i in range(20):
        state = jax.tree.map(lambda a: a[i], starts)
        plan = solve_frozenlake(np.asarray(state.holes), np.asarray(state.player), np.asarray(state.goal))
        total = 0.0
        for t, action in enumerate(plan):
            assert not bool(state.done)
            state, reward, done, info = step(jax.random.key(t), state, action, params)
            total += float(reward)
        assert bool(done) and bool(info["success"]) and total == 1.0 and not bool(info["truncated"])


def test_render_formats_and_end_symbols(step):
    params = FrozenLakeParams(desc=("SH", "FG"), success_rate=1.0)
    state = FROZENLAKE.reset(jax.random.key(0), params)
    assert FROZENLAKE.render_text(state, params, "grid_coord") == (
        "Board size: 2 rows x 2 cols\nGoal: (1, 1)\nHoles: (0, 1)\nPlayer: (0, 0)\nP O\n_ G"
    )
    in_hole, reward, done, info = step(jax.random.key(0), state, 3, params)  # Right, into the hole
    assert FROZENLAKE.render_text(in_hole, params) == "_ X\n_ G"
    assert bool(done) and float(reward) == 0 and not bool(info["success"]) and not bool(info["truncated"])
    below, *_ = step(jax.random.key(0), state, 2, params)
    on_goal, reward, done, info = step(jax.random.key(0), below, 3, params)
    assert FROZENLAKE.render_text(on_goal, params) == "_ O\n_ √"
    assert float(reward) == 1 and bool(done) and bool(info["success"])
    with pytest.raises(ValueError, match="render format 'pixels'"):
        FROZENLAKE.render_text(state, params, "pixels")


def test_truncation_invalid_actions_and_frozen_after_done(step):
    params = FrozenLakeParams(desc=("SF", "FG"), success_rate=1.0, max_steps=3)
    state = FROZENLAKE.reset(jax.random.key(0), params)
    state, reward, done, info = step(jax.random.key(0), state, 0, params)  # invalid: a no-op step
    assert not bool(info["action_is_valid"]) and not bool(info["action_is_effective"]) and int(state.step_count) == 1
    state, reward, done, info = step(jax.random.key(0), state, 1, params)  # Left into the border
    assert bool(info["action_is_valid"]) and not bool(info["action_is_effective"])
    state, reward, done, info = step(jax.random.key(0), state, 4, params)  # Up into the border: limit
    assert bool(done) and bool(info["truncated"]) and not bool(info["success"])
    after, reward, done, info = step(jax.random.key(0), state, 3, params)
    assert float(reward) == 0 and bool(done) and not bool(info["action_is_effective"])
    for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(state)):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 1.0 / 3.0, 1.0]))
def test_random_play_invariants_1024_envs(seed, success_rate):
    params = FrozenLakeParams(size=5, success_rate=success_rate, max_steps=12)
    rollout = _batched_rollout(params)
    key = jax.random.key(seed)
    players, rewards, dones, successes, truncs = (np.asarray(a) for a in rollout(key))
    assert players.min() >= 0 and players.max() < 5
    # Reward 1 exactly once, on the step an episode succeeds; nothing after done.
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    assert np.all(rewards.sum(0) <= 1)
    newly_done = dones & ~np.concatenate([np.zeros_like(dones[:1]), dones[:-1]])
    assert np.all((rewards == 1) == (newly_done & successes))
    assert np.all(dones[-1])  # max_steps = 12 steps were taken
    assert not np.any(successes & truncs)


_ROLLOUTS = {}  # one compiled rollout per success_rate (a static parameter)


def _batched_rollout(params):
    if params.success_rate not in _ROLLOUTS:

        @jax.jit
        def rollout(key):
            k_reset, k_act, k_step = jax.random.split(key, 3)
            states = FROZENLAKE.reset_batch(jax.random.split(k_reset, 1024), params)
            actions = jax.random.randint(k_act, (params.max_steps, 1024), 0, 5)  # 0 is invalid

            def body(states, xs):
                actions, key = xs
                states, rewards, dones, infos = jax.vmap(FROZENLAKE.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(key, 1024), states, actions, params
                )
                return states, (states.player, rewards, dones, infos["success"], infos["truncated"])

            _, out = jax.lax.scan(body, states, (actions, jax.random.split(k_step, params.max_steps)))
            return out

        _ROLLOUTS[params.success_rate] = rollout
    return _ROLLOUTS[params.success_rate]
