"""Random rewards (`env.reward_noise`): which rewards are replaced, by what, and that the step
keeps the true outcome in its metrics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rl.reward_noise import randomize_rewards
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.training.step import StepConfig, Trainer

from agent_setup import TEST_LAYERS, text_parts, tiny_model


def numpy_reference(key, rewards, q):
    """The same draws (Bernoulli(q) per row, a uniform source row per row) applied by a loop."""
    k_replace, k_source = jax.random.split(key)
    replace = np.asarray(jax.random.uniform(k_replace, rewards.shape) < q)
    source = np.asarray(jax.random.randint(k_source, rewards.shape, 0, len(rewards)))
    out = np.array(rewards, np.float32)
    for row in range(len(rewards)):
        if replace[row]:
            out[row] = rewards[source[row]]
    return out, replace


@settings(max_examples=25, deadline=None)
@given(seed=hs.integers(0, 2**31 - 1), q=hs.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]),
       rewards=hs.lists(hs.floats(-2, 11, width=32), min_size=1, max_size=40))
def test_each_reward_is_kept_or_taken_from_the_batch(seed, q, rewards):
    rewards = np.asarray(rewards, np.float32)
    out, replaced = randomize_rewards(jax.random.key(seed), jnp.asarray(rewards), q)
    out, replaced = np.asarray(out), np.asarray(replaced)
    expected, expected_replaced = numpy_reference(jax.random.key(seed), rewards, q)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(replaced, expected_replaced)
    np.testing.assert_array_equal(out[~replaced], rewards[~replaced])  # the rest unchanged
    assert set(out.tolist()) <= set(rewards.tolist())  # a replaced reward is one of the batch's
    if q == 0.0:
        assert not replaced.any()
    if q == 1.0:
        assert replaced.all()


def test_replaced_fraction_is_q_and_sources_are_uniform():
    """Over 64K rows: the replaced fraction within 4 standard errors of q, and the source rows of
    the replaced rewards spread evenly over the batch (chi-square, 15 degrees of freedom)."""
    batch, q = 16, 0.3
    rewards = jnp.arange(batch, dtype=jnp.float32)  # a reward names its source row
    keys = jax.random.split(jax.random.key(0), 4096)
    out, replaced = jax.vmap(lambda k: randomize_rewards(k, rewards, q))(keys)
    out, replaced = np.asarray(out), np.asarray(replaced)
    n = replaced.size
    assert abs(replaced.mean() - q) < 4 * np.sqrt(q * (1 - q) / n)
    counts = np.bincount(out[replaced].astype(int), minlength=batch)
    expected = replaced.sum() / batch
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 37.7  # the 0.999 quantile of chi-square with 15 degrees of freedom


ROLLOUT = RolloutConfig(num_groups=2, group_size=4, max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2,
                        max_new_tokens=8)


def test_the_step_logs_the_true_outcome_and_the_replaced_fraction():
    """With every reward replaced the rollout (same key) and its logged success and return are
    those of the noiseless step; only the learner's rewards differ."""
    env, params, _, codec, prompt = text_parts("SimpleSokoban", ROLLOUT.max_actions_per_turn)
    model = tiny_model(0, TEST_LAYERS)
    metrics = {}
    for q in (0.0, 1.0):
        config = StepConfig(rollout=ROLLOUT, filter=FilterConfig(strategy="none"),
                            algo=AlgoConfig.preset("grpo", mini_batch_size=4), reward_noise=q)
        trainer = Trainer(config, model, env, params, codec, prompt)
        _, metrics[q] = trainer.step(trainer.init_state(jax.random.key(0), model))
    assert "rollout/rewards_replaced" not in metrics[0.0]
    assert float(metrics[1.0]["rollout/rewards_replaced"]) == 1.0
    for name in ("rollout/success", "rollout/return", "rollout/response_length"):
        assert float(metrics[1.0][name]) == float(metrics[0.0][name]), name


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_reward_noise_outside_zero_to_one_is_refused(q):
    with pytest.raises(ValueError, match=r"env.reward_noise=.* must be in \[0, 1\]"):
        dataclasses.replace(StepConfig(rollout=ROLLOUT, algo=AlgoConfig.preset("grpo", mini_batch_size=4)),
                            reward_noise=q)
