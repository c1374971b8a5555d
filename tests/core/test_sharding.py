"""The same train step on 1 device and on 8 fake CPU devices (tests/conftest.py) gives the
same parameters and metrics; the same seed gives the same numbers."""

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models.value import critic_from_policy
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.core import sharding
from ragen_jax.training.step import StepConfig, Trainer

from agent_setup import step_parts

ROLLOUT = RolloutConfig(num_groups=4, group_size=4, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4,
                        max_new_tokens=12)
# PPO without filtering. A random policy's rewards are all the same format penalties, so the
# critic gets a random value head: advantages (return − value) then differ per token and
# every step really moves the parameters (with a zero head, whitening constant advantages
# would only amplify rounding noise).
CONFIG = StepConfig(rollout=ROLLOUT, filter=FilterConfig(strategy="none"),
                    algo=AlgoConfig.preset("ppo", mini_batch_size=8, actor_lr=1e-4, critic_lr=1e-4))


@pytest.fixture(scope="module")
def parts():
    return step_parts(ROLLOUT.max_actions_per_turn)


def trainer_for(parts, mesh):
    env, params, codec, prompt, model = parts
    return Trainer(CONFIG, model, env, params, codec, prompt, mesh)


def run(parts, trainer, steps=2):
    model = parts[-1]
    critic = critic_from_policy(model)
    critic.value_head = nnx.Param(0.1 * jax.random.normal(jax.random.key(5), critic.value_head.shape))
    state = trainer.init_state(jax.random.key(7), model, critic)
    history = []
    for _ in range(steps):
        state, metrics = trainer.step(state)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def assert_same_weights(got, want):
    """Within 1e-5 — except where Adam's first steps (≈ lr·sign(g)) meet a gradient that is
    ~0 (a token seen once): rounding noise can flip its sign, a move of up to 2·lr per step.
    Losses and gradient norms, compared tightly below, pin that the updates are the same."""
    diff = np.abs(got - want)
    assert np.mean(diff > 1e-5) < 1e-4, np.sort(diff)[-10:]
    assert diff.max() <= 2 * 2 * CONFIG.algo.actor_lr, diff.max()


def flat(tree):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


@pytest.fixture(scope="module")
def single_trainer(parts):
    return trainer_for(parts, None)


@pytest.fixture(scope="module")
def single(parts, single_trainer):
    return run(parts, single_trainer)


def test_same_seed_same_numbers(parts, single, single_trainer):
    state, history = run(parts, single_trainer)
    assert history == single[1]
    np.testing.assert_array_equal(flat(state.policy), flat(single[0].policy))


@pytest.mark.parametrize("shape", [(2, 2, 2), (8, 1, 1)])  # every axis at once; data only (per-device rollouts)
def test_sharded_step_matches_one_device(parts, single, shape):
    mesh = sharding.make_mesh(shape)
    state, history = run(parts, trainer_for(parts, mesh))
    ref_state, ref_history = single
    assert history[-1]["update/minibatches"] == 2.0
    initial = flat(nnx.state(parts[-1]))
    assert np.abs(flat(ref_state.policy) - initial).max() > 1e-4  # the steps moved the weights
    for got, want in ((state.policy, ref_state.policy), (state.critic, ref_state.critic)):
        assert_same_weights(flat(got), flat(want))
    for got, want in zip(history, ref_history):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # parameters really are laid out over the mesh
    embed = state.policy["embed_tokens"][...]
    assert len(embed.sharding.device_set) == mesh.size
