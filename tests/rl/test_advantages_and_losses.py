"""Advantages and losses against plain NumPy loops and hand-computed cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.rl import advantages as adv
from ragen_jax.rl import losses


def numpy_gae(rewards, values, mask, gamma, lam):
    """Row by row, backwards over the masked tokens only (unmasked slots are skipped)."""
    out = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        next_value, running = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + gamma * lam * running
            out[b, t] = running
            next_value = values[b, t]
    returns = out + values
    picked = out[mask]
    whitened = (out - picked.mean()) / np.sqrt(picked.var(ddof=1) + 1e-8)
    return whitened * mask, returns


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.sampled_from([1.0, 0.99, 0.9]), lam=st.sampled_from([1.0, 0.95, 0.5]))
def test_gae_matches_numpy_loop(seed, gamma, lam):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(3, 11)).astype(np.float32)
    values = rng.normal(size=(3, 11)).astype(np.float32)
    mask = rng.random((3, 11)) < 0.6
    mask[:, 0] = True  # at least two loss tokens
    mask[0, 1] = True
    got_adv, got_ret = adv.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
    want_adv, want_ret = numpy_gae(rewards.astype(np.float64), values.astype(np.float64), mask, gamma, lam)
    np.testing.assert_allclose(got_adv, want_adv, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got_ret)[mask], want_ret[mask], atol=2e-5)


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    # One trajectory: tokens 0,1 generated, 2,3 an observation, 4,5 generated; reward 1 at the end.
    mask = jnp.array([[1, 1, 0, 0, 1, 1]], bool)
    rewards = jnp.array([[0, 0, 0, 0, 0, 1.0]])
    values = jnp.array([[0.5, 0.25, 9.0, 9.0, 0.5, 0.75]])
    _, returns = adv.gae(rewards, values, mask)
    np.testing.assert_allclose(np.asarray(returns)[np.asarray(mask)], [1, 1, 1, 1])  # γ=λ=1: return = R


def test_group_advantages_grpo_and_dr_grpo():
    scores = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    s = np.asarray(scores)
    want = (s - s.mean(1, keepdims=True)) / (s.std(1, ddof=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(adv.group_advantages(scores), want, rtol=1e-6)
    np.testing.assert_allclose(adv.group_advantages(scores, normalise_std=False), s - s.mean(1, keepdims=True))
    assert np.all(np.asarray(adv.group_advantages(scores))[1] == 0)  # no signal, no NaN
    mask = jnp.array([[1, 1, 0], [0, 1, 1]], bool)
    np.testing.assert_array_equal(adv.broadcast_to_tokens(jnp.array([2.0, -1.0]), mask), [[2, 2, 0], [0, -1, -1]])


def numpy_aggregate(loss, mask, mode):
    if mode == "token-mean":
        return loss[mask].sum() / max(mask.sum(), 1)
    rows = [(loss[b][mask[b]].sum(), mask[b].sum()) for b in range(loss.shape[0]) if mask[b].any()]
    if not rows:
        return 0.0
    if mode == "seq-mean-token-mean":
        return np.mean([s / n for s, n in rows])
    return np.mean([s for s, _ in rows])


@pytest.mark.parametrize("mode", losses.AGGREGATIONS)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_loss_matches_numpy(mode, dual_clip):
    rng = np.random.default_rng(1)
    logp = rng.normal(-1, 0.3, size=(4, 7))
    old = logp + rng.normal(0, 0.4, size=(4, 7))
    advantages = rng.normal(size=(4, 7)) * 2
    mask = rng.random((4, 7)) < 0.7
    mask[3] = False  # a sequence without loss tokens
    ratio = np.exp(logp - old)
    per_token = []
    for r, a in zip(ratio.ravel(), advantages.ravel()):
        loss = max(-a * r, -a * min(max(r, 0.8), 1.28))
        if dual_clip is not None and a < 0:
            loss = min(loss, -a * dual_clip)
        per_token.append(loss)
    per_token = np.array(per_token).reshape(4, 7)
    got, clip_fraction = losses.policy_loss(
        jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), jnp.asarray(advantages, jnp.float32),
        jnp.asarray(mask), dual_clip=dual_clip, aggregation=mode,
    )
    np.testing.assert_allclose(float(got), numpy_aggregate(per_token, mask, mode), rtol=1e-5)
    clipped = -advantages * np.clip(ratio, 0.8, 1.28) > -advantages * ratio
    np.testing.assert_allclose(float(clip_fraction), clipped[mask].mean(), rtol=1e-5)


def test_policy_gradient_at_ratio_one_is_minus_advantage():
    logp = jnp.array([[-1.0, -2.0]])
    grad = jax.grad(lambda lp: losses.policy_loss(lp, logp, jnp.array([[1.0, -2.0]]), jnp.ones((1, 2), bool))[0])(logp)
    np.testing.assert_allclose(grad, [[-0.5, 1.0]])  # token-mean over 2 tokens


def test_actor_loss_is_scaled_surrogate_minus_entropy_plus_kl():
    """The update's (and the gradient analysis's) actor loss from its parts; without a
    reference no KL term, and with task_scale 0 only the regularisation is left."""
    from types import SimpleNamespace

    from ragen_jax.rl.algorithms import AlgoConfig

    rng = np.random.default_rng(2)
    logp, old, ref, entropy = (jnp.asarray(rng.normal(-1, 0.3, (3, 5)), jnp.float32) for _ in range(4))
    rows = SimpleNamespace(old_logprobs=old, advantages=jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
                           loss_mask=jnp.asarray(rng.random((3, 5)) < 0.7))
    algo = AlgoConfig.preset("grpo", entropy_coef=0.01, kl_coef=0.1, kl_estimator="k1")
    norm = losses.aggregation_normaliser(rows.loss_mask, algo.aggregation)
    pg, clip_fraction = losses.policy_loss(logp, old, rows.advantages, rows.loss_mask, aggregation=algo.aggregation)
    ent = losses.aggregate(entropy, rows.loss_mask, algo.aggregation)
    kl = losses.aggregate(logp - ref, rows.loss_mask, algo.aggregation)
    loss, terms = losses.actor_loss(algo, logp, entropy, ref, rows, norm, task_scale=0.5)
    np.testing.assert_allclose(float(loss), 0.5 * pg - 0.01 * ent + 0.1 * kl, rtol=1e-6)
    assert (terms["actor/pg_loss"], terms["actor/entropy"], terms["actor/kl"], terms["actor/clip_frac"]) == (
        pg, ent, kl, clip_fraction)
    no_kl, terms = losses.actor_loss(algo, logp, entropy, None, rows, norm)
    np.testing.assert_allclose(float(no_kl), pg - 0.01 * ent, rtol=1e-6)
    assert float(terms["actor/kl"]) == 0.0
    reg_grad = jax.grad(lambda lp: losses.actor_loss(algo, lp, entropy, ref, rows, norm, task_scale=0.0)[0])(logp)
    np.testing.assert_allclose(reg_grad, jax.grad(lambda lp: 0.1 * losses.aggregate(lp - ref, rows.loss_mask,
                                                                                    algo.aggregation))(logp))


def test_kl_estimators_and_value_loss():
    logp = np.array([[-1.0, -0.5, -3.0]])
    ref = np.array([[-1.2, -0.5, -1.0]])
    np.testing.assert_allclose(losses.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k1"), logp - ref, rtol=1e-6)
    r = np.exp(ref - logp)
    np.testing.assert_allclose(losses.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"), np.clip(r - np.log(r) - 1, -10, 10), rtol=1e-6)
    assert float(losses.kl_penalty(jnp.asarray(logp), jnp.asarray(logp), "k3").max()) == 0.0
    with pytest.raises(ValueError, match="kl estimator 'k2'"):
        losses.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k2")

    values, old, returns = np.array([[1.0, 0.0, 2.0]]), np.array([[0.0, 0.0, 1.0]]), np.array([[2.0, 1.0, 0.0]])
    clipped = np.clip(values, old - 0.5, old + 0.5)
    want = 0.5 * np.maximum((values - returns) ** 2, (clipped - returns) ** 2).mean()
    got = losses.value_loss(jnp.asarray(values), jnp.asarray(old), jnp.asarray(returns), jnp.ones((1, 3), bool))
    np.testing.assert_allclose(float(got), want, rtol=1e-6)
    with pytest.raises(ValueError, match="loss aggregation 'mean'"):
        losses.aggregate(jnp.zeros((1, 3)), jnp.ones((1, 3)), "mean")
