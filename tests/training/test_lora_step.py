"""LoRA in the jitted train step: only the adapters (and PPO's value head) train, the base
weights pass through unchanged, the KL reference is the base (the adapters switched off), and
a step-0 LoRA policy plays exactly as its base; scanned layers too. With adapter dropout the
rollout is the same program and only the update's loss forwards draw masks."""

import dataclasses
import functools
import json

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import lora
from ragen_jax.models.config import DecoderConfig, LoraConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.core.errors import ConfigError
from ragen_jax.run import checkpoint
from ragen_jax.run.checkpoint import Checkpoints
from ragen_jax.training.step import StepConfig, Trainer, play_rollout

from agent_setup import TEST_LAYERS, text_parts

ROLLOUT = RolloutConfig(num_groups=2, group_size=4, max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2,
                        max_new_tokens=8)
LORA = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def parts():
    env, params, _, codec, prompt = text_parts("SimpleSokoban", ROLLOUT.max_actions_per_turn)
    return env, params, codec, prompt


def make(parts, cfg, name="ppo", **algo):
    env, params, codec, prompt = parts
    model = init_model(cfg, jax.random.key(0))
    algo = AlgoConfig.preset(name, **{"mini_batch_size": 4, "actor_lr": 1e-2, "critic_lr": 1e-2, **algo})
    config = StepConfig(rollout=ROLLOUT, filter=FilterConfig(strategy="none"), algo=algo)
    return Trainer(config, model, env, params, codec, prompt), model


def leaves(state, kind):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.filter_state(state, kind))]


def test_ppo_step_trains_only_the_adapters_and_the_value_head_and_resumes_exactly(parts, tmp_path):
    cfg = DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, lora=LORA)
    tr, model = make(parts, cfg, "ppo", kl_coef=0.1, kl_estimator="k3")
    assert tr.setup.learner.lora
    state = tr.init_state(jax.random.key(1), model)
    assert state.reference is None  # the reference is the policy's own base: no copy
    base0, critic_base0 = leaves(state.policy, nnx.Not(lora.LoRAParam)), leaves(
        state.critic, nnx.Not(nnx.Any(lora.LoRAParam, nnx.PathContains("value_head"))))
    adapters0 = leaves(state.policy, lora.LoRAParam)
    # the optimisers hold moments of the adapters (and the critic's head) only
    adapter_count = sum(a.size for a in adapters0)
    assert sum(x.size for x in jax.tree.leaves(state.policy_opt)) < 3 * adapter_count + 16
    assert sum(x.size for x in jax.tree.leaves(state.critic_opt)) < 3 * (adapter_count + cfg.hidden_size) + 16
    kls = []
    for i in range(2):
        if i == 1:  # a checkpoint after the first step (adapters, their optimiser moments, the rest)
            checkpoints = Checkpoints(tmp_path, asynchronous=False)
            checkpoints.save(state)
            checkpoints.close()
        state, metrics = tr.step(state)
        kls.append(float(metrics["actor/kl"]))
    # the checkpoint holds what trains, not the base weights, and names its base with a fingerprint
    saved = sum(p.stat().st_size for p in (tmp_path / "checkpoints" / "1").rglob("*") if p.is_file())
    assert saved < sum(x.nbytes for x in base0) / 2, saved  # with the base weights: over 2x (policy and critic)
    fingerprint = json.loads((tmp_path / "checkpoints" / "1" / checkpoint.BASE).read_text())["fingerprint"]
    assert len(fingerprint) == len(base0)
    # resumed from the checkpoint (onto the same base), the second step comes out bit for bit the same
    checkpoints = Checkpoints(tmp_path, read_only=True)
    resumed = checkpoints.restore(1, tr.init_state(jax.random.key(9), model))
    # onto another base: one line naming it, not a damaged checkpoint
    other = init_model(cfg, jax.random.key(5))
    with pytest.raises(ConfigError, match="holds LoRA adapters of another base"):
        Checkpoints(tmp_path, read_only=True).restore(1, tr.init_state(jax.random.key(9), other))
    with pytest.raises(ConfigError, match="holds LoRA adapters of another base"):
        Checkpoints(tmp_path, read_only=True).restore_policy(1, nnx.state(other))
    checkpoints.close()
    again, _ = tr.step(resumed)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(a) if jax.dtypes.issubdtype(
            a.dtype, jax.dtypes.prng_key) else a), np.asarray(jax.random.key_data(b) if jax.dtypes.issubdtype(
            b.dtype, jax.dtypes.prng_key) else b))
    for before, after in zip(base0, leaves(state.policy, nnx.Not(lora.LoRAParam))):
        np.testing.assert_array_equal(before, after)  # the base weights: bit for bit unchanged
    for before, after in zip(critic_base0, leaves(
            state.critic, nnx.Not(nnx.Any(lora.LoRAParam, nnx.PathContains("value_head"))))):
        np.testing.assert_array_equal(before, after)
    assert any(not np.array_equal(a, b) for a, b in zip(adapters0, leaves(state.policy, lora.LoRAParam)))
    assert np.abs(leaves(state.critic, nnx.PathContains("value_head"))[0]).max() > 0
    # every B has moved off zero: gradients reached each adapter
    assert all(np.abs(b).max() > 0 for b in leaves(nnx.filter_state(state.policy, lora.LoRAParam),
                                                   nnx.PathContains("lora_b")))
    # KL to the base: 0 while the policy is the base (first minibatch), then positive
    assert np.isfinite(kls).all() and kls[1] > 0, kls


def test_scanned_lora_policy_plays_as_its_base_at_step_zero_then_trains_adapters_only(parts):
    """Step 0: the LoRA policy's rollout equals its base model's token for token (B = 0); a GRPO
    step on scanned (stacked) layers moves the adapters only."""
    env, params, codec, prompt = parts
    base_tr, base = make(parts, DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, scan_layers=True), "grpo")
    tr, model = make(parts, DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, scan_layers=True, lora=LORA), "grpo")
    key = jax.random.key(7)
    want = base_tr.play_rollout(nnx.state(base), key, codec, prompt)
    got = tr.play_rollout(nnx.state(model), key, codec, prompt)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state = tr.init_state(jax.random.key(1), model)
    base0 = leaves(state.policy, nnx.Not(lora.LoRAParam))
    state, metrics = tr.step(state)
    assert np.isfinite(float(metrics["actor/loss"]))
    for before, after in zip(base0, leaves(state.policy, nnx.Not(lora.LoRAParam))):
        np.testing.assert_array_equal(before, after)
    b = leaves(nnx.filter_state(state.policy, lora.LoRAParam), nnx.PathContains("lora_b"))
    assert b[0].shape[0] == TEST_LAYERS and all(np.abs(x).max() > 0 for x in b)  # stacked [layers, rank, out]


def test_lora_update_learns_a_fixed_batch_and_on_an_fsdp_mesh_matches_one_device(parts):
    """Repeated PPO updates on one rollout with fixed rewards: the LoRA policy raises the
    likelihood of the rewarded answers (the policy loss falls), as full fine-tuning does in
    tests/training/test_step.py::test_repeated_updates_on_a_fixed_batch_lower_the_loss. The
    first update on a 2-device FSDP mesh (weights and adapters split, optimiser moments
    following them) runs, keeps the base weights and moves the adapters as on one device. Adam's
    first steps normalise each gradient entry, so reduction-order noise on near-zero entries
    shows at the learning rate's scale: compared by correlation, not elementwise."""
    from ragen_jax.core import sharding

    env, params, codec, prompt = parts
    cfg = DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, lora=LORA)
    model = init_model(cfg, jax.random.key(0))
    algo = AlgoConfig.preset("ppo", mini_batch_size=4, actor_lr=1e-2, critic_lr=1e-2)
    config = StepConfig(rollout=ROLLOUT, filter=FilterConfig(strategy="none"), algo=algo)
    one = Trainer(config, model, env, params, codec, prompt)
    devices = sharding.make_mesh((1, 2, 1))
    mesh = Trainer(config, model, env, params, codec, prompt, devices)
    state = one.init_state(jax.random.key(1), model)
    traj = one.play_rollout(state.policy, jax.random.key(3), codec, prompt)
    rewards = np.tile(np.array([0.0, 1.0, 2.0, 3.0], np.float32), ROLLOUT.num_groups)
    traj = traj.with_episode_rewards(rewards, rewards > 2.5)
    start = leaves(state.policy, lora.LoRAParam)  # before the update donates the state
    want, metrics = one.update(state, traj, jax.random.key(1))
    losses = [float(metrics["actor/pg_loss"])]
    traj_on_mesh = jax.tree.map(lambda x: sharding.put_replicated(x, devices), traj)
    got, _ = mesh.update(mesh.init_state(jax.random.key(1), model), traj_on_mesh,
                         sharding.put_replicated(jax.random.key(1), devices))
    a = nnx.filter_state(got.policy, lora.LoRAParam)
    assert any(x.sharding.spec != jax.sharding.PartitionSpec() for x in jax.tree.leaves(a))
    moved = lambda new: np.concatenate([(np.asarray(n) - o).ravel() for n, o in zip(jax.tree.leaves(new), start)])
    assert np.corrcoef(moved(nnx.filter_state(want.policy, lora.LoRAParam)), moved(a))[0, 1] > 0.9
    for x, y in zip(leaves(want.policy, nnx.Not(lora.LoRAParam)), leaves(got.policy, nnx.Not(lora.LoRAParam))):
        np.testing.assert_array_equal(x, y)
    for _ in range(4):  # `want` is donated to the next update: read above
        want, metrics = one.update(want, traj, jax.random.key(1))
        losses.append(float(metrics["actor/pg_loss"]))
    assert losses[-1] < losses[0] - 1e-3, losses


def test_lora_dropout_leaves_the_rollout_and_draws_masks_in_the_update_only(parts):
    """model.lora.dropout = 0.5: the rollout (its tokens and old log-probs) is the program
    without dropout; the PPO update still moves only the adapters and the critic's head, and
    what it moves them to depends on the update's key: the masks (without dropout this update,
    with no random filter, gives the same adapters for any key)."""
    env, params, codec, prompt = parts
    tr0, model = make(parts, DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, lora=LORA), "ppo")
    dropped = dataclasses.replace(LORA, dropout=0.5)
    tr, _ = make(parts, DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, lora=dropped), "ppo")
    assert tr.setup.learner.dropout and not tr0.setup.learner.dropout
    key = jax.random.key(3)
    lowered = lambda t: jax.jit(functools.partial(play_rollout, t.setup)).lower(
        nnx.state(model), key, codec, prompt).as_text()
    assert lowered(tr) == lowered(tr0)
    traj = tr.play_rollout(nnx.state(model), key, codec, prompt)
    fresh = lambda: tr.init_state(jax.random.key(1), model)
    base0 = leaves(fresh().policy, nnx.Not(lora.LoRAParam))
    runs = [tr.update(fresh(), traj, jax.random.key(k))[0] for k in (1, 1, 2)]
    for state in runs:
        for before, after in zip(base0, leaves(state.policy, nnx.Not(lora.LoRAParam))):
            np.testing.assert_array_equal(before, after)
        assert all(np.abs(b).max() > 0 for b in leaves(state.policy, nnx.PathContains("lora_b")))
    trained = lambda s, model: leaves(getattr(s, model), nnx.Any(lora.LoRAParam, nnx.PathContains("value_head")))
    for part in ("policy", "critic"):
        same = zip(trained(runs[0], part), trained(runs[1], part))
        assert all(np.array_equal(a, b) for a, b in same), part  # the same key: the same masks
        assert any(not np.allclose(a, b) for a, b in zip(trained(runs[0], part), trained(runs[2], part))), part
