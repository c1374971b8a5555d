"""Gradient analysis by reward-std bucket (docs/method.md#the-gradient-analysis).

The bucket rule against NumPy, the per-bucket gradient norms against jax.grad of the loss
written out on a batch sliced to the bucket's rows, and the mechanism itself on the tiny
random model: task-gradient norm grows with reward std, regularisation norm stays flat."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.diagnostics.grad_analysis import bucket_capacity, gradient_norms, reward_std_buckets
from ragen_jax.envs import registry
from ragen_jax.models import hf
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rl import advantages as adv
from ragen_jax.rl import losses
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.batch import batch_from_trajectories, policy_logprobs
from ragen_jax.rollout.play import RolloutConfig, rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate

from agent_setup import TEST_LAYERS

GROUPS, MEMBERS = 6, 4
ROLLOUT = RolloutConfig(num_groups=GROUPS, group_size=MEMBERS, max_turns=1, max_actions_per_turn=2,
                        max_actions_per_traj=2, max_new_tokens=12)
# One static setting for every model test but the seq-mean one: 6 buckets of one group each,
# gathered into 5 rows (one more than a bucket can hold), so each bucket's 4 rows come with a
# masked-out row of another group.
NUM_BUCKETS = GROUPS
CAPACITY = bucket_capacity(GROUPS, MEMBERS, NUM_BUCKETS) + 1
LOSS = dict(entropy_coef=0.01, kl_coef=0.1, kl_estimator="k3", clip_low=0.2, clip_high=0.28)  # AlgoConfig fields
TEMPERATURE = 1.0


def rewarded(traj, rewards):
    """The trajectories with synthetic episode rewards (success: reward > 2.5)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    return traj.with_episode_rewards(rewards, rewards > 2.5)


# ----------------------------------------------------------------------------- bucket rule


def reference_buckets(rewards: np.ndarray, num_buckets: int) -> np.ndarray:
    """The documented rule in NumPy: rank by unbiased std (stable sort), floor(rank·nb/G)."""
    std = np.std(rewards.astype(np.float32), axis=1, ddof=1)
    order = np.argsort(std, kind="stable")
    rank = np.empty(len(std), np.int64)
    rank[order] = np.arange(len(std))
    return rank * num_buckets // len(std)


@settings(max_examples=50, deadline=None)
@given(data=st.data(), groups=st.integers(1, 13), members=st.sampled_from([2, 4, 8]),
       num_buckets=st.integers(1, 8))
def test_buckets_match_numpy_with_ties(data, groups, members, num_buckets):
    """Small-integer rewards with N a power of two: every std is computed exactly up to the
    final rounding, so groups with equal reward spread tie bit for bit and the tie rule
    (lower group index first) is what is tested."""
    values = data.draw(st.lists(st.integers(0, 3), min_size=groups * members, max_size=groups * members))
    rewards = np.array(values, np.float32).reshape(groups, members)
    got = np.asarray(reward_std_buckets(jnp.asarray(rewards), num_buckets))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, reference_buckets(rewards, num_buckets))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), groups=st.integers(1, 13), members=st.integers(2, 5), num_buckets=st.integers(1, 8))
def test_buckets_are_balanced_quantiles(data, groups, members, num_buckets):
    """Arbitrary float rewards: bucket sizes are floor/ceil of G/nb (when nb <= G), so their
    rows never exceed `bucket_capacity`, and a clearly larger std never lands in a lower bucket."""
    values = data.draw(st.lists(st.floats(-5, 5, width=32), min_size=groups * members,
                                max_size=groups * members))
    rewards = np.array(values, np.float32).reshape(groups, members)
    got = np.asarray(reward_std_buckets(jnp.asarray(rewards), num_buckets))
    assert got.min() >= 0 and got.max() < num_buckets
    sizes = np.bincount(got, minlength=num_buckets)
    if num_buckets <= groups:
        assert set(sizes.tolist()) <= {groups // num_buckets, -(-groups // num_buckets)}
    else:
        assert sizes.max() == 1
    assert sizes.max() * members <= bucket_capacity(groups, members, num_buckets)
    std = np.std(rewards.astype(np.float64), axis=1, ddof=1)
    for g in range(groups):
        for h in range(groups):
            if std[g] < std[h] - 1e-4 * (1 + std[h]):
                assert got[g] <= got[h]


def test_buckets_known_case_with_ties_straddling_a_boundary():
    """G = 7 (not divisible by 3). Equal spreads (bitwise-equal stds) for groups 1, 3, 6 (the
    lowest), 0, 2, 5, and 4 alone (the highest). Stable order 1 3 6 0 2 5 4, bucket =
    rank·3 // 7: the tied groups 0 and 2 go to bucket 1, group 5 (same std, higher index) to
    bucket 2 with group 4."""
    spread = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.0, 2.0]}
    rewards = np.array([spread[s] for s in [1, 0, 1, 0, 2, 1, 0]], np.float32)
    got = np.asarray(reward_std_buckets(jnp.asarray(rewards), 3))
    np.testing.assert_array_equal(got, [1, 0, 1, 0, 2, 2, 0])
    np.testing.assert_array_equal(got, reference_buckets(rewards, 3))


def test_buckets_reject_single_member_groups():
    with pytest.raises(ValueError, match="N >= 2"):
        reward_std_buckets(jnp.zeros((4, 1)), 2)


# ----------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def setup():
    env, params = registry.make("FrozenLake")  # the shortest prompt: cheapest passes
    tok = hf.load_tokenizer()
    codec = TextCodec.build(tok, env, ROLLOUT.max_actions_per_turn)
    prompt = PromptTemplate.build(tok, env, ROLLOUT.max_actions_per_turn)
    cfg = DecoderConfig.preset("tiny", num_layers=TEST_LAYERS)
    model = init_model(cfg, jax.random.key(0))
    reference = init_model(cfg, jax.random.key(1))  # differs: KL has a gradient
    return env, params, codec, prompt, model, reference


@pytest.fixture(scope="module")
def trajectories(setup):
    env, params, codec, prompt, model, _ = setup
    return jax.jit(lambda k: rollout(k, model_policy(model, codec, prompt, ROLLOUT), env, params, codec, prompt,
                                     ROLLOUT))(jax.random.key(3))


def batch_with(traj, group_rewards, normalise_std):
    """The update's batch view with synthetic rewards and group-baseline advantages."""
    batch = batch_from_trajectories(rewarded(traj, group_rewards.reshape(-1)))
    per_row = adv.group_advantages(jnp.asarray(group_rewards), normalise_std=normalise_std).reshape(-1)
    return batch.replace(advantages=adv.broadcast_to_tokens(per_row, batch.loss_mask))


GROUP_OF_ROW = jnp.repeat(jnp.arange(GROUPS, dtype=jnp.int32), MEMBERS)


@pytest.fixture(scope="module")
def norms_fn(setup):
    """gradient_norms of the tiny model, jitted once per static setting."""
    model, reference = setup[4], setup[5]
    graph = nnx.graphdef(model)

    @functools.cache
    def compiled(aggregation, num_buckets, rows_per_bucket):
        algo = AlgoConfig.preset("grpo", aggregation=aggregation, **LOSS)
        return jax.jit(lambda params, ref, batch, buckets: gradient_norms(
            graph, params, batch, GROUP_OF_ROW, buckets, num_buckets, algo, temperature=TEMPERATURE,
            reference_params=ref, rows_per_bucket=rows_per_bucket))

    def run(batch, buckets, aggregation="token-mean", num_buckets=NUM_BUCKETS, rows_per_bucket=CAPACITY):
        out = compiled(aggregation, num_buckets, rows_per_bucket)(nnx.state(model), nnx.state(reference), batch,
                                                                 jnp.asarray(buckets, jnp.int32))
        return {k: float(v) for k, v in out.items()}

    return run


def global_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))


# ----------------------------------------------------------------------------- against slicing


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_norms_equal_grad_of_the_loss_on_the_bucket_rows_alone(setup, trajectories, norms_fn, aggregation):
    """Masking the other buckets' rows (with the bucket's own normaliser) = slicing the
    bucket's rows into a batch of their own and differentiating the actor loss written out
    from rl.losses. Each bucket's 4 rows are gathered with a masked-out row of another group;
    advantages GRPO, old log-probs moved so that some ratios get clipped, KL + entropy on."""
    model, reference = setup[4], setup[5]
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 4, (GROUPS, MEMBERS)).astype(np.float32)
    rewards[2] = 1.0  # one zero-variance group
    batch = batch_with(trajectories, rewards, normalise_std=True)
    noise = jnp.asarray(rng.uniform(-0.4, 0.4, batch.old_logprobs.shape), jnp.float32)
    batch = batch.replace(old_logprobs=batch.old_logprobs + noise)
    buckets = np.asarray(reward_std_buckets(jnp.asarray(rewards), NUM_BUCKETS))
    got = norms_fn(batch, buckets, aggregation)

    graph = nnx.graphdef(model)
    params, ref_params = nnx.state(model), nnx.state(reference)

    def task(p, b):
        logp, _ = policy_logprobs(nnx.merge(graph, p), b, TEMPERATURE)
        return losses.policy_loss(logp, b.old_logprobs, b.advantages, b.loss_mask, clip_low=LOSS["clip_low"],
                                  clip_high=LOSS["clip_high"], aggregation=aggregation)[0]

    def reg(p, b):
        logp, entropy = policy_logprobs(nnx.merge(graph, p), b, TEMPERATURE)
        ref_logp = jax.lax.stop_gradient(policy_logprobs(nnx.merge(graph, ref_params), b, 1.0)[0])
        kl = losses.kl_penalty(logp, ref_logp, LOSS["kl_estimator"])
        return (-LOSS["entropy_coef"] * losses.aggregate(entropy, b.loss_mask, aggregation)
                + LOSS["kl_coef"] * losses.aggregate(kl, b.loss_mask, aggregation))

    grads = jax.jit(lambda p, b: (jax.grad(task)(p, b), jax.grad(reg)(p, b)))
    group_std = np.std(rewards.astype(np.float64), axis=1, ddof=1)
    for g in range(GROUPS):
        prefix = f"grad/bucket{buckets[g]}/"
        assert got[prefix + "groups"] == 1
        sub = jax.tree.map(lambda a: a[g * MEMBERS:(g + 1) * MEMBERS], batch)
        task_grad, reg_grad = grads(params, sub)
        np.testing.assert_allclose(got[prefix + "task_norm"], global_norm(task_grad), rtol=1e-4, err_msg=prefix)
        np.testing.assert_allclose(got[prefix + "reg_norm"], global_norm(reg_grad), rtol=1e-4, err_msg=prefix)
        np.testing.assert_allclose(got[prefix + "reward_std"], group_std[g], rtol=1e-5)
    assert got[f"grad/bucket{buckets[2]}/task_norm"] == 0.0  # zero variance: all advantages 0


# ----------------------------------------------------------------------------- the mechanism

SCALES = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 4.0], np.float32)
SHUFFLE = np.array([3, 0, 5, 1, 4, 2])  # group g gets reward spread SCALES[SHUFFLE[g]]
PATTERN = np.array([-1.5, 0.5, 1.5, -0.5], np.float32)
MECHANISM_REWARDS = 1.0 + SCALES[SHUFFLE][:, None] * PATTERN[None, :]


@pytest.fixture(scope="module")
def mechanism(trajectories, norms_fn):
    """Norms under Dr.GRPO and GRPO advantages for groups with reward stds ∝ 0, ¼, ½, 1, 2, 4
    (in shuffled group order), in 6 quantile buckets."""
    buckets = np.asarray(reward_std_buckets(jnp.asarray(MECHANISM_REWARDS), NUM_BUCKETS))
    return buckets, {name: norms_fn(batch_with(trajectories, MECHANISM_REWARDS, normalise_std=name == "grpo"),
                                    buckets) for name in ("drgrpo", "grpo")}


def test_task_norm_grows_with_reward_std_while_regularisation_stays_flat(mechanism):
    """The mechanism of docs/method.md#template-collapse. Under Dr.GRPO advantages (R − group
    mean: the reward's scale kept) the task-gradient norm grows with the bucket's reward std
    and is 0 at std 0; the KL + entropy gradient norm does not look at the rewards and stays
    flat."""
    buckets, norms = mechanism
    np.testing.assert_array_equal(buckets, SHUFFLE)  # bucket = rank of the std
    drgrpo = norms["drgrpo"]
    task, reg, std = (np.array([drgrpo[f"grad/bucket{b}/{name}"] for b in range(NUM_BUCKETS)])
                      for name in ("task_norm", "reg_norm", "reward_std"))
    np.testing.assert_allclose(std, SCALES * np.std(PATTERN, ddof=1), rtol=1e-5)
    print("\nreward std", std.round(3), "\ntask norm ", task.round(4), "\nreg norm  ", reg.round(4))

    assert task[0] == 0.0 and np.all(task[1:] > 0) and np.all(reg > 0)
    # from std ¼ to std 4 the advantages grow 16×; the trajectories differ, so not exactly 16×
    task_spread = task[-1] / task[1]
    reg_spread = reg.max() / reg.min()
    assert task_spread > 4
    assert reg_spread < 2
    assert task_spread > 3 * reg_spread
    # the per-bucket SNR (task / regularisation) rises with the reward std
    assert task[-1] / reg[-1] > 4 * task[1] / reg[1]

    # GRPO divides by the group std: the zero-variance bucket still gets exactly no task gradient
    grpo = norms["grpo"]
    assert grpo["grad/bucket0/task_norm"] == 0.0
    assert all(grpo[f"grad/bucket{b}/task_norm"] > 0 for b in range(1, NUM_BUCKETS))
    for b in range(NUM_BUCKETS):  # the regulariser does not see the advantages at all
        np.testing.assert_allclose(grpo[f"grad/bucket{b}/reg_norm"], reg[b], rtol=1e-6)


def test_over_capacity_and_empty_buckets_give_nan_and_leave_the_others_alone(trajectories, norms_fn, mechanism):
    """The groups of the three lowest stds all put in bucket 0 (12 rows > capacity 5),
    buckets 1 and 2 left empty: NaN norms there (and a NaN std for the empty ones), bucket 0
    still reports its groups and their mean std, and buckets 3-5 are unchanged."""
    buckets, norms = mechanism
    merged = np.where(buckets < 3, 0, buckets)
    got = norms_fn(batch_with(trajectories, MECHANISM_REWARDS, normalise_std=False), merged)
    ref = norms["drgrpo"]
    for b in (0, 1, 2):
        assert np.isnan(got[f"grad/bucket{b}/task_norm"]) and np.isnan(got[f"grad/bucket{b}/reg_norm"])
    assert got["grad/bucket0/groups"] == 3 and got["grad/bucket1/groups"] == got["grad/bucket2/groups"] == 0
    assert np.isnan(got["grad/bucket1/reward_std"]) and np.isnan(got["grad/bucket2/reward_std"])
    np.testing.assert_allclose(got["grad/bucket0/reward_std"], np.mean(SCALES[:3]) * np.std(PATTERN, ddof=1),
                               rtol=1e-5)
    for b in range(3, NUM_BUCKETS):
        for name in ("task_norm", "reg_norm", "reward_std", "groups"):
            assert got[f"grad/bucket{b}/{name}"] == ref[f"grad/bucket{b}/{name}"], (b, name)
