"""The jitted train step: batch view, filtered update, micro-batching, presets, determinism."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ragen_jax.models.decoder import init_model
from ragen_jax.models.stacking import stack_layers
from ragen_jax.rl.algorithms import AlgoConfig, lr_decay_factor, optimizer
from ragen_jax.rl.batch import batch_from_trajectories, policy_logprobs, previous_valid_slot
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.play import RolloutConfig, rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.core.sharding import device_bytes
from ragen_jax.training import micro_batch
from ragen_jax.training.step import StepConfig, Trainer, resolve_micro_batch

from agent_setup import step_parts, tiny_model

# One turn for the update's tests (half the buffer, twice as fast to run); two where the
# buffer's turn layout is what is tested.
ROLLOUT = RolloutConfig(num_groups=4, group_size=4, max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2,
                        max_new_tokens=16)
TWO_TURNS = dataclasses.replace(ROLLOUT, max_turns=2, max_actions_per_traj=4)
FILTER = FilterConfig(update="fewer_steps")


@pytest.fixture(scope="module")
def setup():
    return step_parts(ROLLOUT.max_actions_per_turn)


def rolled_out(setup, config, seed=3):
    """A jitted rollout of `config` by setup's model (its last part), from key `seed`."""
    env, params, codec, prompt, model = setup
    return jax.jit(lambda k: rollout(k, model_policy(model, codec, prompt, config), env, params, codec, prompt,
                                     config))(jax.random.key(seed))


@pytest.fixture(scope="module")
def trajectories(setup):
    """A rollout of the random tiny model with synthetic per-row rewards: groups 0 and 2 vary
    (rewards 0..3 within the group), groups 1 and 3 are constant."""
    traj = rolled_out(setup, ROLLOUT)
    rewards = np.zeros((4, 4), np.float32)
    rewards[0] = [0.0, 1.0, 2.0, 3.0]
    rewards[2] = [3.0, 0.5, 0.0, 1.0]
    rewards[1] = 1.0
    return rewarded(traj, rewards.reshape(-1))


@pytest.fixture(scope="module")
def two_turns(setup):
    """A two-turn rollout of the random tiny model, rewarded as `trajectories`."""
    return rewarded(rolled_out(setup, TWO_TURNS), np.tile([0.0, 1.0, 2.0, 3.0], 4))


TRAINERS = {}  # one Trainer (and its compiled programs) per distinct setting, shared by the tests


def trainer(setup, rollout_config=ROLLOUT, mesh=None, **algo):
    """The Trainer of `algo`'s settings (PPO unless `name` is given) over `rollout_config`, built
    once per setting in this module: tests that share a setting share its compiled update."""
    key = (id(setup[-1]), rollout_config, id(mesh), tuple(sorted(algo.items())))
    if key not in TRAINERS:  # the model and mesh are kept with it, so their ids stay theirs
        TRAINERS[key] = (build_trainer(setup, rollout_config, mesh, **algo), setup[-1], mesh)
    return TRAINERS[key][0]


def build_trainer(setup, rollout_config, mesh, **algo):
    env, params, codec, prompt, model = setup
    # Top-p with full minibatches and ceil(kept / minibatch) steps unless a test says otherwise
    filt = algo.pop("filter", FILTER)
    name = algo.pop("name", "ppo")
    total_steps = algo.pop("total_steps", 0)
    algo = AlgoConfig.preset(name, **{"mini_batch_size": 4, "actor_lr": 1e-3, "critic_lr": 1e-3, **algo})
    config = StepConfig(rollout=rollout_config, filter=filt, algo=algo, total_steps=total_steps)
    return Trainer(resolve_micro_batch(config, model, env, params, codec, prompt, mesh), model, env, params, codec,
                   prompt, mesh)


def params_of(state):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(state.policy)])


def rewarded(traj, rewards):
    """The trajectories with synthetic episode rewards (success: reward > 2.5)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    return traj.with_episode_rewards(rewards, rewards > 2.5)


# ----------------------------------------------------------------------------- batch view


def test_previous_valid_slot_against_a_python_loop():
    rng = np.random.default_rng(0)
    mask = rng.random((5, 30)) < 0.6
    got = np.asarray(previous_valid_slot(jnp.asarray(mask)))
    for b in range(5):
        last = 0
        for s in range(30):
            assert got[b, s] == last
            if mask[b, s]:
                last = s


def test_training_forward_reproduces_sampling_logprobs(setup, two_turns):
    """The update's compact view recomputes exactly the log-probs the sampler recorded."""
    model, trajectories = setup[-1], two_turns
    batch = batch_from_trajectories(trajectories)
    assert int(batch.loss_mask.sum()) == int(trajectories.loss_mask.sum()) > 0
    logp, entropy = jax.jit(lambda m, b: policy_logprobs(m, b, 1.0))(model, batch)
    lm = np.asarray(batch.loss_mask)
    np.testing.assert_allclose(np.asarray(logp)[lm], np.asarray(batch.old_logprobs)[lm], atol=1e-5)
    assert np.all(np.asarray(entropy)[lm] > 0)
    # rewards moved with their tokens
    np.testing.assert_allclose(np.asarray(batch.rewards).sum(1), np.asarray(trajectories.episode_reward))


@pytest.mark.parametrize("layout", ["unrolled", "scanned, remat"])
def test_shared_prompt_runs_once_with_the_same_numbers_and_gradients(setup, two_turns, layout):
    """The system prompt (the same in every row) is run for one row and every row reads its
    keys/values: log-probs, entropies and parameter gradients equal a forward over every row
    (per-layer model, and scanned layers with rematerialisation)."""
    model, trajectories = setup[-1], two_turns
    if layout != "unrolled":
        scanned = init_model(dataclasses.replace(model.cfg, scan_layers=True, remat=True), jax.random.key(0))
        state = nnx.state(scanned)
        nnx.replace_by_pure_dict(state, stack_layers(nnx.to_pure_dict(nnx.state(model))))
        nnx.update(scanned, state)
        model = scanned
    batch = batch_from_trajectories(trajectories)
    assert batch.shared_prefix == trajectories.layout.system > 0
    assert np.all(np.asarray(trajectories.tokens[:, :batch.shared_prefix]) == np.asarray(trajectories.tokens[0, :batch.shared_prefix]))
    graph, params = nnx.split(model)

    def loss(p, b):
        logp, entropy = policy_logprobs(nnx.merge(graph, p), b, 0.7)
        return jnp.sum(jnp.where(b.loss_mask, logp + 0.1 * entropy, 0.0)), (logp, entropy)

    run = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (_, shared), grads = run(params, batch)
    (_, full), want = run(params, batch.replace(shared_prefix=0))
    lm = np.asarray(batch.loss_mask)
    for got, ref in zip(shared, full):
        np.testing.assert_allclose(np.asarray(got)[lm], np.asarray(ref)[lm], atol=1e-5)
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5 * (1 + float(np.abs(ref).max())))


@pytest.fixture(scope="module")
def hot_moves(setup):
    """The shipped Sokoban warm start (it writes `<answer> Up || Left </answer>`), rolled out at
    T 0.5 with each action's first token at T 2 (`RolloutConfig.action_sampling`)."""
    from ragen_jax.models.sampling import SamplingParams
    from ragen_jax.run.experiment import load_initial_weights

    env, params, codec, prompt, _ = setup
    model = tiny_model(0)
    load_initial_weights(model, "builtin:sokoban-tiny")
    config = dataclasses.replace(TWO_TURNS, max_new_tokens=48, sampling=SamplingParams(temperature=0.5),
                                 action_sampling=SamplingParams(temperature=2.0))  # the tiny configs' 48
    return model, config, rolled_out((env, params, codec, prompt, model), config, seed=5)


def completes(before: str, after: str, marker: str) -> bool:
    """`marker` ends in the part of `after` (the text with one more token) past `before`."""
    return any(i + len(marker) > len(before) for i in range(len(after)) if after.startswith(marker, i))


def test_action_temperature_marks_each_action_start_and_the_update_recomputes_it(hot_moves):
    """A generated token records T 2 exactly when the token before it completes `<answer>` or
    `||` (checked on the tokenizer's own decode), and the update's forward with those per-token
    temperatures reproduces the sampled log-probs (one temperature for all would not)."""
    from ragen_jax.models import hf

    model, config, traj = hot_moves
    tok = hf.load_tokenizer()
    tokens, temps, loss = (np.asarray(a) for a in (traj.tokens, traj.temperatures, traj.loss_mask))
    hot = 0
    for row in range(config.batch):
        for offset in traj.layout.generation_offsets:
            ids = [int(tokens[row, s]) for s in range(offset, offset + config.max_new_tokens) if loss[row, s]]
            slots = [s for s in range(offset, offset + config.max_new_tokens) if loss[row, s]]
            for j, slot in enumerate(slots):
                before, after = tok.decode(ids[:j - 1]) if j else "", tok.decode(ids[:j])
                starts = j > 0 and (completes(before, after, "<answer>") or completes(before, after, "||"))
                assert temps[row, slot] == (2.0 if starts else 0.5), (row, slot, after)
                hot += starts
    assert 0 < hot < loss.sum()

    batch = batch_from_trajectories(traj)
    score = jax.jit(lambda m, b: policy_logprobs(m, b, 0.5)[0])
    lm = np.asarray(batch.loss_mask)
    old = np.asarray(batch.old_logprobs)[lm]
    np.testing.assert_allclose(np.asarray(score(model, batch))[lm], old, atol=1e-4)  # f32, trained weights
    assert not np.allclose(np.asarray(score(model, batch.replace(temperatures=None)))[lm], old, atol=1e-3)


def test_the_update_scores_hot_moves_at_their_temperature(setup, hot_moves):
    """One GRPO minibatch over the whole batch: its log-probs before the step equal the sampled
    ones (approx KL 0), which needs the batch's per-token temperatures in the actor loss."""
    model, config, traj = hot_moves
    traj = rewarded(traj, np.tile([0.0, 1.0, 2.0, 3.0], 4))
    one = trainer((*setup[:4], model), config, name="grpo", mini_batch_size=config.batch,
                  filter=FilterConfig(strategy="none"))  # the warm start has the tiny model's 3 layers
    _, metrics = one.update(one.init_state(jax.random.key(0), model), traj, jax.random.key(1))
    assert float(metrics["update/minibatches"]) == 1
    assert abs(float(metrics["actor/approx_kl"])) < 1e-5  # at T 0.5 for every token: > 0.1


# ----------------------------------------------------------------------------- the update


@pytest.fixture(scope="module")
def grpo(setup):
    return trainer(setup, name="grpo")


def test_filtered_update_equals_an_update_on_the_kept_groups_alone(setup, trajectories, grpo):
    """Dropped groups change nothing: top-p keeps groups 0 and 2 (the only ones with reward
    variance); the result equals a run whose batch holds just those two groups."""
    model = setup[-1]
    state, metrics = grpo.update(grpo.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    assert float(metrics["filter/kept_count"]) == 2 and float(metrics["update/minibatches"]) == 2

    small = dataclasses.replace(ROLLOUT, num_groups=2)
    alone = trainer(setup, small, name="grpo")
    rows = np.r_[0:4, 8:12]
    kept = jax.tree.map(lambda a: a[rows] if getattr(a, "ndim", 0) and a.shape[0] == 16 else a, trajectories)
    ref_state, ref_metrics = alone.update(alone.init_state(jax.random.key(0), model), kept, jax.random.key(1))
    np.testing.assert_allclose(params_of(state), params_of(ref_state), atol=1e-6)
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        np.testing.assert_allclose(float(metrics[name]), float(ref_metrics[name]), rtol=1e-5, err_msg=name)


def test_half_the_groups_kept_runs_half_the_minibatches(setup, trajectories, grpo):
    model = setup[-1]
    everything = trainer(setup, name="grpo", filter=FilterConfig(strategy="none"))
    _, all_metrics = everything.update(everything.init_state(jax.random.key(0), model), trajectories,
                                       jax.random.key(1))
    _, half_metrics = grpo.update(grpo.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    assert float(all_metrics["update/minibatches"]) == 4
    assert float(half_metrics["update/minibatches"]) == 2
    assert float(half_metrics["filter/kept_ratio"]) == 0.5


def test_empty_selection_skips_the_update_cleanly(setup, trajectories, grpo):
    model = setup[-1]
    flat = rewarded(trajectories, np.ones(16, np.float32))
    state = grpo.init_state(jax.random.key(0), model)
    before = params_of(state)
    for streak in (1, 2):
        state, metrics = grpo.update(state, flat, jax.random.key(1))
        assert float(metrics["filter/empty"]) == 1 and float(metrics["update/minibatches"]) == 0
        assert float(metrics["filter/empty_streak"]) == streak
        assert all(np.isfinite(float(v)) or k.startswith(("actor/", "critic/")) for k, v in metrics.items())
    np.testing.assert_array_equal(params_of(state), before)
    state, _ = grpo.update(state, trajectories, jax.random.key(1))
    assert int(state.empty_streak) == 0 and int(state.step) == 3


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_repeated_updates_on_a_fixed_batch_lower_the_loss(setup, trajectories, name, grpo):
    model = setup[-1]
    tr = grpo if name == "grpo" else trainer(setup, name="ppo", filter=FilterConfig(strategy="none"))
    state = tr.init_state(jax.random.key(0), model)
    losses, value_losses = [], []
    for _ in range(5):
        state, metrics = tr.update(state, trajectories, jax.random.key(1))
        losses.append(float(metrics["actor/pg_loss"]))
        value_losses.append(float(metrics.get("critic/vf_loss", 0.0)))
    assert losses[-1] < losses[0] - 1e-3, losses
    if name == "ppo":
        assert value_losses[-1] < 0.75 * value_losses[0], value_losses  # rewards are partly noise


def test_micro_batches_accumulate_to_the_minibatch_update(setup, trajectories):
    model = setup[-1]
    whole = trainer(setup, name="ppo", filter=FilterConfig(strategy="none"))
    micro = trainer(setup, name="ppo", filter=FilterConfig(strategy="none"), micro_batch_size=2)
    a, ma = whole.update(whole.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    b, mb = micro.update(micro.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    # Adam divides by sqrt(v): on near-zero gradients summation-order noise is amplified, so
    # parameters agree to a few percent of one step (lr 1e-3); the losses agree tightly.
    np.testing.assert_allclose(params_of(a), params_of(b), atol=5e-5)
    for name in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
        np.testing.assert_allclose(float(ma[name]), float(mb[name]), rtol=1e-4, err_msg=name)


def test_micro_batches_of_padding_only_are_skipped(setup, trajectories):
    """Top-p keeps groups 0 and 2 (8 rows) of a 16-row minibatch: with micro-batches of 4, the
    last two hold only padding and are not run, and the update equals the whole minibatch's."""
    model = setup[-1]
    whole = trainer(setup, name="grpo", mini_batch_size=16)
    micro = trainer(setup, name="grpo", mini_batch_size=16, micro_batch_size=4)
    a, ma = whole.update(whole.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    b, mb = micro.update(micro.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    assert float(ma["update/kept_rows"]) == 8 and float(mb["update/kept_rows"]) == 8
    assert float(ma["update/micro_batches"]) == 1 and float(mb["update/micro_batches"]) == 2
    np.testing.assert_allclose(params_of(a), params_of(b), atol=5e-5)
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):  # the GRPO loss is ~1e-7 here
        np.testing.assert_allclose(float(ma[name]), float(mb[name]), rtol=1e-4, atol=1e-6, err_msg=name)


def test_an_auto_micro_batch_updates_as_its_number_set_by_hand(setup, trajectories):
    """"auto" given the room for micro-batches of 4 (their compiled forward+backward beside the
    train state) chooses 4, and its update is bitwise the one with 4 set by hand."""
    model = setup[-1]
    layout = trajectories.layout
    batch = micro_batch.micro_batch_inputs(4, layout.length, layout.turns * layout.generation, None)
    stats = micro_batch.compile_gradient(nnx.graphdef(model), micro_batch.abstract_params(nnx.state(model), None),
                                         batch, None).memory_analysis()
    four = stats.temp_size_in_bytes + 2 * stats.output_size_in_bytes + device_bytes(batch)
    hand = trainer(setup, name="grpo", mini_batch_size=16, micro_batch_size=4)
    s = hand.abstract_state(model)
    room = device_bytes((s.policy, s.policy_opt, s.critic, s.critic_opt, s.reference)) + four + 16
    auto = trainer(setup, name="grpo", mini_batch_size=16, micro_batch_size="auto",
                   micro_batch_memory_gib=room / micro_batch.SAFETY / 2 ** 30)
    assert auto.config.algo.micro_batch_size == 4
    a, ma = hand.update(hand.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    b, mb = auto.update(auto.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    np.testing.assert_array_equal(params_of(a), params_of(b))
    assert {k: float(v) for k, v in ma.items()} == {k: float(v) for k, v in mb.items()}
    assert float(mb["update/micro_batches"]) == 2  # the kept 8 rows in micro-batches of 4


# ----------------------------------------------------------------------------- the paper's update after filtering


PAPER = FilterConfig(update="paper")


def test_paper_update_equals_smaller_minibatches_over_the_kept_groups_alone(setup, trajectories):
    """`paper`: 16 rows in minibatches of 4 is 4 optimiser steps; Top-p keeps 8 rows, so each
    step trains on 2 of them. The result equals 4 steps of 2-row minibatches over a batch that
    holds only the kept groups."""
    model = setup[-1]
    paper = trainer(setup, name="grpo", filter=PAPER)
    state, metrics = paper.update(paper.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    assert float(metrics["update/kept_rows"]) == 8 and float(metrics["update/minibatches"]) == 4

    alone = trainer(setup, dataclasses.replace(ROLLOUT, num_groups=2), name="grpo", mini_batch_size=2)
    rows = np.r_[0:4, 8:12]
    kept = jax.tree.map(lambda a: a[rows] if getattr(a, "ndim", 0) and a.shape[0] == 16 else a, trajectories)
    ref_state, ref_metrics = alone.update(alone.init_state(jax.random.key(0), model), kept, jax.random.key(1))
    assert float(ref_metrics["update/minibatches"]) == 4
    # a 4-row window with 2 rows masked against 2-row minibatches: another float summation order,
    # which Adam amplifies on near-zero gradients (a parameter in 10^5 by up to ~2e-5; lr 1e-3)
    np.testing.assert_allclose(params_of(state), params_of(ref_state), atol=5e-5)
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        np.testing.assert_allclose(float(metrics[name]), float(ref_metrics[name]), rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("update", ["paper", "fewer_steps"])
def test_optimiser_steps_and_passes_per_mode_whatever_is_kept(setup, trajectories, update):
    """16 rows, minibatches of 4, micro-batches of 1 row, 2 epochs; the groups with varying
    rewards are kept (4, 2 or 1 of them). `paper` takes 4 optimiser steps per epoch whatever is
    kept, `fewer_steps` one per 4 kept rows; in both the forward/backward passes run are the
    kept rows (padding rows are never run)."""
    model = setup[-1]
    tr = trainer(setup, name="grpo", micro_batch_size=1, epochs=2,
                 filter=FilterConfig(strategy="none", include_zero=False, update=update))
    spread = np.array([0.0, 1.0, 2.0, 3.0])
    for varying in (4, 2, 1):
        rewards = np.ones((4, 4), np.float32)
        rewards[:varying] = spread
        _, metrics = tr.update(tr.init_state(jax.random.key(0), model), rewarded(trajectories, rewards.reshape(-1)),
                               jax.random.key(1))
        kept = 4 * varying
        assert float(metrics["update/kept_rows"]) == kept
        assert float(metrics["update/minibatches"]) == 2 * (4 if update == "paper" else kept // 4)
        assert float(metrics["update/micro_batches"]) == 2 * kept  # the actor's passes, both epochs


def test_with_every_group_kept_both_modes_are_the_same_update(setup, trajectories):
    model = setup[-1]
    results = []
    for update in ("paper", "fewer_steps"):
        tr = trainer(setup, name="grpo", micro_batch_size=2,
                     filter=FilterConfig(strategy="none", loss_scaling="linear", update=update))
        state, metrics = tr.update(tr.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
        results.append((params_of(state), {k: float(v) for k, v in metrics.items()}))
    (a, ma), (b, mb) = results
    # Two programs (the modes' loops differ), so their float rounding may differ, most where
    # Adam divides a gradient near 0 by its eps; a different update moves weights by up to the
    # learning rate, 1e-3.
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
    assert ma.keys() == mb.keys() and ma["update/minibatches"] == mb["update/minibatches"] == 4
    assert ma["update/loss_scale"] == mb["update/loss_scale"] == 1.0
    for name in ma:
        np.testing.assert_allclose(ma[name], mb[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_paper_mode_scales_the_policy_loss_by_the_steps_keep_ratio(setup, trajectories):
    """One optimiser step (a 16-row minibatch) on the 8 rows Top-p keeps: with `linear` the policy
    loss and its gradient are half the unscaled ones (no entropy or KL here; `sqrt` and uneven
    steps: tests/rl/test_filtering.py)."""
    model = setup[-1]
    got = {}
    for scaling in ("none", "linear"):
        tr = trainer(setup, name="grpo", mini_batch_size=16, entropy_coef=0.0,
                     filter=FilterConfig(loss_scaling=scaling, update="paper"))
        _, got[scaling] = tr.update(tr.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
    plain = got["none"]
    assert float(plain["update/minibatches"]) == 1 and float(plain["update/kept_rows"]) == 8
    scaled = got["linear"]
    assert float(plain["update/loss_scale"]) == 1.0 and float(scaled["update/loss_scale"]) == 0.5
    np.testing.assert_allclose(float(scaled["actor/grad_norm"]), 0.5 * float(plain["actor/grad_norm"]), rtol=1e-5)
    np.testing.assert_allclose(float(scaled["actor/loss"]), 0.5 * float(plain["actor/loss"]), rtol=1e-5, atol=1e-9)


def test_kl_to_the_reference_grows_as_the_policy_moves(setup, trajectories):
    model = setup[-1]
    tr = trainer(setup, name="grpo", kl_coef=0.1, kl_estimator="k3")
    state = tr.init_state(jax.random.key(0), model)
    assert state.reference is not None
    kls = []
    for _ in range(3):
        state, metrics = tr.update(state, trajectories, jax.random.key(1))
        kls.append(float(metrics["actor/kl"]))
    assert 0 < kls[0] < kls[1] < kls[2], kls  # 0 on the first minibatch, then growing
    # the reference stays the initial policy
    np.testing.assert_array_equal(jax.tree.leaves(state.reference)[0], jax.tree.leaves(nnx.state(model))[0])


# ----------------------------------------------------------------------------- presets and errors


def test_presets_select_the_recipes():
    assert AlgoConfig.preset("ppo").uses_critic
    grpo, drgrpo, dapo = (AlgoConfig.preset(n) for n in ("grpo", "drgrpo", "dapo"))
    assert (grpo.advantage, grpo.aggregation) == ("grpo", "seq-mean-token-mean")
    assert (drgrpo.advantage, drgrpo.aggregation) == ("drgrpo", "seq-mean-token-sum")
    assert (dapo.clip_low, dapo.clip_high, dapo.aggregation, dapo.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    assert not any(a.uses_critic for a in (grpo, drgrpo, dapo))
    assert AlgoConfig.preset("ppo").actor_lr == 1e-6 and AlgoConfig.preset("ppo").critic_lr == 1e-5


@pytest.mark.parametrize("make, message", [
    (lambda: AlgoConfig.preset("sac"), "algo.name='sac'"),
    (lambda: AlgoConfig.preset("dapo", kl_coef=0.1), "algo.kl_coef"),
    (lambda: AlgoConfig.preset("grpo", mini_batch_size=8, micro_batch_size=3), "algo.micro_batch_size=3"),
    (lambda: AlgoConfig.preset("grpo", lr_warmup=-1), "algo.lr_warmup=-1"),
    (lambda: AlgoConfig.preset("grpo", adam_eps=0.0), "algo.adam_eps=0.0"),
    (lambda: AlgoConfig.preset("grpo", lr_decay_fraction=1.5), "algo.lr_decay_fraction=1.5"),
    (lambda: StepConfig(rollout=ROLLOUT, algo=AlgoConfig.preset("grpo", lr_decay_fraction=0.5)),
     "algo.lr_decay_fraction=0.5 needs the run's length"),
    (lambda: StepConfig(rollout=dataclasses.replace(ROLLOUT, group_size=1), algo=AlgoConfig.preset("grpo"),
                        filter=FilterConfig(metric="reward_mean")), "group_size"),
    (lambda: StepConfig(rollout=ROLLOUT, algo=AlgoConfig.preset("grpo", mini_batch_size=5)), "mini_batch_size=5"),
])
def test_invalid_settings_name_the_key(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()


def test_a_micro_batch_at_least_the_minibatch_means_the_whole_minibatch():
    """The tiny configs' micro-batches of 8 stay valid when a smaller minibatch is set."""
    assert AlgoConfig.preset("grpo", mini_batch_size=4, micro_batch_size=8).micro_batch == 4
    assert AlgoConfig.preset("grpo", mini_batch_size=64, micro_batch_size=8).micro_batch == 8
    assert AlgoConfig.preset("grpo", mini_batch_size=64, micro_batch_size=0).micro_batch == 64


def test_lr_warmup_scales_the_first_updates_linearly():
    """With lr_warmup=4 the k-th update (k = 0, 1, ...) is k/4 of the constant-rate one on the
    same gradients (Adam's moments do not depend on the rate); from update 4 on they agree."""
    grads = [{"w": jnp.array([0.3, -1.2, 0.05])}, {"w": jnp.array([-0.1, 0.4, 2.0])}] * 3
    params = {"w": jnp.array([1.0, -2.0, 0.5])}
    plain = optimizer(1e-2, AlgoConfig.preset("grpo", weight_decay=0.0))
    warm = optimizer(1e-2, AlgoConfig.preset("grpo", weight_decay=0.0, lr_warmup=4))
    s_plain, s_warm = plain.init(params), warm.init(params)
    for k, g in enumerate(grads):
        u_plain, s_plain = plain.update(g, s_plain, params)
        u_warm, s_warm = warm.update(g, s_warm, params)
        np.testing.assert_allclose(u_warm["w"], min(k / 4, 1.0) * u_plain["w"], rtol=1e-6, atol=1e-9)
    # without a warm-up the optimiser state keeps the layout older checkpoints were saved with
    before = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    assert jax.tree.structure(plain.init(params)) == jax.tree.structure(before.init(params))


def test_lr_decay_factor_falls_linearly_over_the_last_steps():
    """Against a plain loop: 1 before the last D = fraction · total steps of the run, then
    (total - step) / D: 1 where the decay starts, 1/D at the run's last step."""
    for total in (1, 4, 7, 400):
        for fraction in (0.0, 0.25, 0.375, 0.5, 1.0):
            decay = fraction * total
            for step in range(total):
                want = 1.0 if fraction == 0 or step <= total - decay else (total - step) / decay
                got = float(lr_decay_factor(jnp.int32(step), total, fraction))
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{total} {fraction} {step}")


def test_lr_decay_scales_the_whole_update(setup, trajectories):
    """In the decay an optimiser update's parameter change is the factor times the
    constant-rate change from the same state and batch; before it, the same change. (One
    minibatch: the kept 8 rows of 16.)"""
    model = setup[-1]
    grpo = trainer(setup, name="grpo", mini_batch_size=16)
    decaying = trainer(setup, name="grpo", mini_batch_size=16, lr_decay_fraction=0.5, total_steps=8)
    start = lambda tr: tr.init_state(jax.random.key(0), model)  # fresh: the update donates its state
    before = params_of(start(grpo))
    plain, _ = grpo.update(start(grpo), trajectories, jax.random.key(1))
    for step, factor in ((0, 1.0), (4, 1.0), (5, 0.75), (7, 0.25)):
        state = start(decaying)
        state, metrics = decaying.update(state.replace(step=state.step + step), trajectories, jax.random.key(1))
        assert float(metrics["update/lr_factor"]) == factor
        # a separate program: its rounding may differ by a little of a 1e-3 step where Adam's
        # gradient is near 0
        np.testing.assert_allclose(params_of(state) - before, factor * (params_of(plain) - before), atol=1e-6)


def test_adam_eps_damps_only_parameters_with_gradients_below_it():
    """Adam's first update is lr * g / (|g| + eps): about lr for every parameter with the default
    eps, and lr * |g| / eps for a gradient far below a larger eps (a plain NumPy reference)."""
    g = np.array([1e-1, 1e-3, 1e-7, -1e-8])
    params = {"w": jnp.zeros(4)}
    for eps in (1e-8, 1e-5):
        tx = optimizer(1e-2, AlgoConfig.preset("grpo", weight_decay=0.0, grad_clip=10.0, adam_eps=eps))
        update, _ = tx.update({"w": jnp.asarray(g, jnp.float32)}, tx.init(params), params)
        np.testing.assert_allclose(update["w"], -1e-2 * g / (np.abs(g) + eps), rtol=1e-4)


def test_bfloat16_adam_moments_follow_a_numpy_adamw_that_rounds_them():
    """`adam_moments="bfloat16"`: the moments are stored in bfloat16, and each update is AdamW's
    computed in float32 from the stored moments (a NumPy loop that rounds both moments to
    bfloat16 after every step, with bias correction, weight decay and the rate)."""
    import ml_dtypes

    lr, wd, eps, b1, b2 = 1e-2, 0.1, 1e-8, 0.9, 0.999
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=5), jnp.float32)}
    grads = [jnp.asarray(rng.normal(size=5) * 0.3, jnp.float32) for _ in range(6)]
    tx = optimizer(lr, AlgoConfig.preset("grpo", weight_decay=wd, grad_clip=100.0, adam_moments="bfloat16"))
    state = tx.init(params)
    assert {leaf.dtype for leaf in jax.tree.leaves(state) if leaf.ndim == 1} == {jnp.dtype(jnp.bfloat16)}
    to_bf16 = lambda x: np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    mu = nu = np.zeros(5)
    w = np.asarray(params["w"], np.float64)
    for k, g in enumerate(grads, start=1):
        update, state = tx.update({"w": g}, state, params)
        g = np.asarray(g, np.float64)
        mu, nu = b1 * mu + (1 - b1) * g, b2 * nu + (1 - b2) * g * g
        want = -lr * ((mu / (1 - b1 ** k)) / (np.sqrt(nu / (1 - b2 ** k)) + eps) + wd * w)
        np.testing.assert_allclose(np.asarray(update["w"]), want, rtol=5e-5, atol=1e-9)  # bf16 would miss by 4e-3
        mu, nu = to_bf16(mu), to_bf16(nu)  # what is stored
    stored = [leaf for leaf in jax.tree.leaves(state) if leaf.ndim == 1]
    np.testing.assert_array_equal(np.sort(np.concatenate([np.asarray(x, np.float64) for x in stored])),
                                  np.sort(np.concatenate([mu, nu])))
    with pytest.raises(ValueError, match="algo.adam_moments='float16' is not supported"):
        AlgoConfig.preset("grpo", adam_moments="float16")


def test_stochastic_weight_rounding_lets_a_1e_6_step_move_bfloat16_weights(setup, trajectories):
    """A GRPO update at the paper's rate (1e-6) on bfloat16 weights: rounded to nearest, no
    weight above 0.01 in magnitude moves (the step is below its precision); with
    `weight_rounding="stochastic"` some do, by one bfloat16 spacing, and the same key gives the
    same weights. The rounding's statistics: tests/rl/test_rounding.py."""
    from ragen_jax.models.config import DecoderConfig

    from agent_setup import TEST_LAYERS

    env, params, codec, prompt, _ = setup
    model = init_model(DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, param_dtype="bfloat16"),
                       jax.random.key(0))

    def trainer_for(rounding):
        algo = AlgoConfig.preset("grpo", mini_batch_size=4, actor_lr=1e-6, weight_rounding=rounding)
        return Trainer(StepConfig(rollout=ROLLOUT, filter=FilterConfig(strategy="none"), algo=algo), model, env,
                       params, codec, prompt)

    def updated(tr):
        state, _ = tr.update(tr.init_state(jax.random.key(0), model), trajectories, jax.random.key(1))
        return params_of(state)

    before = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(nnx.state(model))])
    big = np.abs(before) > 0.01
    assert big.sum() > 10_000
    assert (updated(trainer_for("nearest"))[big] == before[big]).all()
    tr = trainer_for("stochastic")
    stochastic = updated(tr)
    moved = stochastic[big] != before[big]
    assert moved.mean() > 0.001, moved.mean()
    spacing = 2.0 ** (np.floor(np.log2(np.abs(before[big]))) - 7)
    # four optimiser steps (16 rows, minibatches of 4), each to a neighbouring bfloat16 value at most
    assert (np.abs(stochastic[big] - before[big]) <= 4 * spacing).all()
    np.testing.assert_array_equal(updated(tr), stochastic)


# ----------------------------------------------------------------------------- diagnostics wiring


def test_diagnostics_and_gradient_analysis_run_at_step_one_and_every_compute_freq_steps(setup):
    """MI metrics and the gradient analysis's per-bucket task/regularisation norms (grad_buckets
    > 0) are computed at steps 1 and 2 (compute_freq 2) and NaN at step 3; the diagnostics state
    (EMA, alarm) is carried in the train state; weights committed to a device (as a warm start or
    a Hugging Face load leaves them) reuse the first step's compilation; on a data-only mesh the
    same MI metrics. The gradient numbers themselves: tests/diagnostics/test_grad_analysis.py."""
    from ragen_jax.diagnostics.diagnose import DiagnosticsConfig, DiagnosticsState

    env, params, codec, prompt, model = setup
    small = dataclasses.replace(ROLLOUT, num_groups=2, max_turns=1, max_new_tokens=8)
    config = StepConfig(rollout=small, filter=FilterConfig(strategy="none"),
                        algo=AlgoConfig.preset("grpo", mini_batch_size=4, entropy_coef=0.01), grad_buckets=2,
                        grad_every=2, diagnostics=DiagnosticsConfig(compute_freq=2, num_samples=4, per_turn_samples=2))
    tr = Trainer(config, model, env, params, codec, prompt)
    warm = nnx.clone(model)
    nnx.update(warm, jax.device_put(nnx.state(warm), jax.devices()[0]))
    state = tr.init_state(jax.random.key(0), warm)
    assert isinstance(state.diagnostics, DiagnosticsState)
    names = [f"grad/bucket{b}/{m}" for b in range(2) for m in ("task_norm", "reg_norm", "groups")]
    computed, first = [], None
    for step in range(1, 4):
        state, metrics = tr.step(state)
        mi = [float(v) for k, v in metrics.items() if k.startswith("mi/")]
        assert mi and (all(np.isfinite(mi)) or all(np.isnan(mi)))
        computed.append(bool(np.isfinite(mi[0])))
        assert np.isfinite(float(metrics["rollout/success"]))
        grads = [float(metrics[n]) for n in names]
        assert all(np.isfinite(grads)) if computed[-1] else all(np.isnan(grads)), (step, grads)
        if step == 1:
            first = {k: float(v) for k, v in metrics.items() if k.startswith("mi/")}
            assert float(metrics["grad/bucket0/groups"]) + float(metrics["grad/bucket1/groups"]) == 2
            assert float(metrics["grad/bucket0/reg_norm"]) > 0
    assert computed == [True, True, False]
    assert tr.compiled_step._cache_size() == 1
    # on a data-only mesh each device scores its own rows inside the step: the same metrics
    from ragen_jax.core import sharding

    on_mesh = Trainer(config, model, env, params, codec, prompt, sharding.make_mesh((2, 1, 1)))
    _, metrics = on_mesh.step(on_mesh.init_state(jax.random.key(0), model))
    for name, value in first.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-4, atol=1e-5, err_msg=name)
