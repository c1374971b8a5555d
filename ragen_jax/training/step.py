"""One training iteration as one compiled function: `train_step(setup, state) -> (state, metrics)`.

In order, all inside XLA (docs/architecture.md#one-compiled-step):

1. rollout: `num_groups × group_size` multi-turn trajectories from the current policy;
2. diagnostics (every `compute_freq` steps and at step 1): cross-scoring MI on the whole
   rollout, before filtering (docs/method.md#the-mi-diagnostics) — when a diagnostics config
   is given;
3. reward-variance filter: score each group (by default its reward variance), keep whole
   groups (docs/method.md#the-reward-variance-filter);
4. advantages: GAE with the critic (PPO) or group baselines (GRPO / Dr.GRPO / DAPO);
5. update over the kept groups only: they are moved to the front, and each optimiser step
   trains on a slice of them (`filter.update`: as many steps as an unfiltered batch on fewer
   rows each, or full minibatches and fewer steps) — loops with data-dependent bounds over
   steps and micro-batches, so dropping groups saves update compute
   (docs/architecture.md#filtering-saves-compute).

The update works on the compact generated-slot view of the rollout (`ragen_jax.rl.batch`); its
pieces are pure functions in `ragen_jax.rl.update`. `Trainer` compiles the step for a mesh and
makes the first state.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from ragen_jax.envs.base import Environment
from ragen_jax.diagnostics import grad_analysis
from ragen_jax.diagnostics.diagnose import DiagnosticsConfig, DiagnosticsState, diagnose
from ragen_jax.models.decoder import Decoder
from ragen_jax.models.stacking import for_inference
from ragen_jax.models.value import ValueModel, critic_from_policy
from ragen_jax.rl import advantages as adv
from ragen_jax.rl import filtering, reward_noise, update
from ragen_jax.rl.algorithms import AUTO, AlgoConfig, lr_decay_factor, optimizer
from ragen_jax.rl.batch import batch_from_trajectories
from ragen_jax.rollout.layout import buffer_layout
from ragen_jax.rollout.play import RolloutConfig, Trajectories, rollout, rollout_on_mesh
from ragen_jax.rollout.policies import model_policy
from ragen_jax.core import sharding
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate
from ragen_jax.training import micro_batch


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything static about a training step."""

    rollout: RolloutConfig = RolloutConfig()
    filter: filtering.FilterConfig = filtering.FilterConfig()
    algo: AlgoConfig = AlgoConfig.preset("ppo")
    diagnostics: DiagnosticsConfig | None = None  # None: no MI metrics
    # Gradient analysis (docs/method.md#the-gradient-analysis, off by default): task vs
    # regularisation gradient norms in this many reward-std quantile buckets (the paper uses 6),
    # at step 1 and every `grad_every` steps (the run config's `diagnostics.compute_freq`,
    # whether or not the MI diagnostics are on).
    grad_buckets: int = 0
    grad_every: int = 0
    # The run's length in train steps (`train.steps`): where `algo.lr_decay_fraction`'s decay ends.
    total_steps: int = 0
    # The chance a finished episode's reward reaches the learner replaced by a random one
    # (`env.reward_noise`, ragen_jax.rl.reward_noise); 0: the true rewards.
    reward_noise: float = 0.0

    def __post_init__(self):
        self.filter.check_group_size(self.rollout.group_size)
        if self.algo.lr_decay_fraction and self.total_steps < 1:
            raise ValueError(f"algo.lr_decay_fraction={self.algo.lr_decay_fraction} needs the run's length "
                             f"(total_steps={self.total_steps}, must be >= 1)")
        self.algo.check_batch(self.rollout.batch, self.rollout.group_size)
        if not 0.0 <= self.reward_noise <= 1.0:
            raise ValueError(f"env.reward_noise={self.reward_noise} must be in [0, 1]")
        if self.grad_buckets < 0 or (self.grad_buckets and self.rollout.group_size < 2):
            raise ValueError(f"grad_buckets={self.grad_buckets} must be >= 0, and > 0 only with "
                             f"rollout.group_size >= 2 (got {self.rollout.group_size})")
        if self.grad_buckets and self.grad_every < 1:
            raise ValueError(f"grad_buckets={self.grad_buckets} runs every diagnostics.compute_freq steps, "
                             f"which must be >= 1 (got {self.grad_every})")


@struct.dataclass
class TrainState:
    """Everything that changes from step to step (a pytree: jit, shard and checkpoint it)."""

    step: jax.Array  # int32: steps completed
    key: jax.Array  # PRNG key for the next step
    policy: nnx.State
    policy_opt: Any
    critic: nnx.State | None
    critic_opt: Any
    reference: nnx.State | None  # frozen initial policy, only when the KL coefficient is set
    empty_streak: jax.Array  # int32: consecutive steps whose filter kept nothing
    diagnostics: Any  # DiagnosticsState (EMA of std(marginal), collapse alarm), or None


@dataclasses.dataclass(frozen=True)
class StepSetup:
    """What a step needs that does not change during a run: its config, the environment and
    its parameters, the learner (the models' structure and optimisers), the mesh (or None)."""

    config: StepConfig
    env: Environment
    env_params: Any
    learner: update.Learner
    mesh: jax.sharding.Mesh | None


# ----------------------------------------------------------------------------- the step


def train_step(setup: StepSetup, state: TrainState, codec: TextCodec, prompt: PromptTemplate):
    """rollout → diagnostics → filter → advantages → update; returns the new state and the
    step's metrics. The text tables (`codec`, `prompt`) are arguments, not graph constants."""
    cfg = setup.config
    key, k_rollout, k_update, k_diag = jax.random.split(state.key, 4)
    # the rollout and the diagnostics only run the policy forward: its weights in the compute dtype
    policy = for_inference(nnx.merge(setup.learner.policy_graph, state.policy))

    # 1. rollout
    traj = play_rollout(setup, state.policy, k_rollout, codec, prompt)
    metrics = rollout_metrics(traj)
    if cfg.reward_noise:  # what the learner sees from here on; the metrics above keep the truth
        key, k_noise = jax.random.split(key)
        noisy, replaced = reward_noise.randomize_rewards(k_noise, traj.episode_reward, cfg.reward_noise)
        traj = traj.with_episode_rewards(noisy, traj.success)
        metrics["rollout/rewards_replaced"] = replaced.astype(jnp.float32).mean()

    # 2. diagnostics on the current policy, before filtering
    diagnostics = state.diagnostics
    if cfg.diagnostics is not None:
        mi, diagnostics = mi_diagnostics(setup, state, policy, traj, k_diag)
        metrics.update(mi)
    if cfg.grad_buckets:
        metrics.update(on_schedule(cfg.grad_every, state, lambda: gradient_analysis(setup, state, traj)))

    # 3-5. filter, advantages, update
    state, update_metrics = update_step(setup, state.replace(key=key, diagnostics=diagnostics), traj, k_update)
    return state, {**metrics, **update_metrics}


def update_step(setup: StepSetup, state: TrainState, traj: Trajectories, key: jax.Array):
    """Filter → advantages → optimiser steps over the kept groups, on a given rollout; returns
    the new state (step + 1) and the update's metrics."""
    cfg, learner, rcfg = setup.config, setup.learner, setup.config.rollout
    batch = batch_from_trajectories(traj)

    # 3. SNR-aware filter: whole groups kept or dropped; kept groups first, the rest padding
    keep, loss_scale, metrics = filter_groups(setup, state, traj, batch, key)
    kept_rows = keep.sum() * rcfg.group_size
    batch, episode_reward = kept_first(setup, keep, kept_rows, batch, traj.episode_reward)

    # 4. advantages of the kept rows
    batch = update.advantages(learner, state.critic, batch, episode_reward, kept_rows, rcfg.group_size)
    lr_factor = lr_decay_factor(state.step, cfg.total_steps, cfg.algo.lr_decay_fraction)

    # 5. optimiser steps over the kept rows (a loop whose trip count depends on how many were kept);
    # the LoRA dropout's and the stochastic rounding's keys folded from the filter's, which stays
    # as without them
    dropout_key = jax.random.fold_in(key, 1) if learner.dropout else None
    rounding_key = jax.random.fold_in(key, 2) if cfg.algo.weight_rounding == "stochastic" else None
    models = update.Models(state.policy, state.policy_opt, state.critic, state.critic_opt, state.reference)
    models, totals, iterations = update.optimise(learner, cfg.filter, models, batch, kept_rows, loss_scale,
                                                 lr_factor, dropout_key, rounding_key)

    metrics.update(update_metrics(cfg.algo, batch, totals, iterations, kept_rows, loss_scale, lr_factor))
    empty = keep.sum() == 0
    new_state = state.replace(step=state.step + 1, policy=models.policy, policy_opt=models.policy_opt,
                              critic=models.critic, critic_opt=models.critic_opt,
                              empty_streak=jnp.where(empty, state.empty_streak + 1, 0))
    metrics["filter/empty_streak"] = new_state.empty_streak.astype(jnp.float32)
    return new_state, metrics


# ----------------------------------------------------------------------------- its parts


def play_rollout(setup: StepSetup, policy_state, key, codec, prompt) -> Trajectories:
    """The step's rollout on its mesh (`rollout_on_mesh`: per device on a data-only mesh)."""
    policy = for_inference(nnx.merge(setup.learner.policy_graph, policy_state))
    cfg = setup.config.rollout
    return rollout_on_mesh(
        lambda part, rows: rollout(key, model_policy(policy, codec, prompt, cfg, part), setup.env,
                                   setup.env_params, codec, prompt, cfg, shard_rows=rows, part=part),
        cfg.batch, setup.mesh)


def on_schedule(every: int, state: TrainState, compute, carried=None):
    """Run `compute` (-> metrics dict, or (metrics, carried)) at step 1 and every `every`
    steps; otherwise NaN metrics and `carried` unchanged."""
    step = state.step + 1  # 1-based index of the step being run
    run = (step == 1) | (step % every == 0)
    shapes = jax.eval_shape(compute)
    nan = lambda tree: jax.tree.map(lambda v: jnp.full(v.shape, jnp.nan, v.dtype), tree)
    skip = (lambda: (nan(shapes[0]), carried)) if isinstance(shapes, tuple) else (lambda: nan(shapes))
    return jax.lax.cond(run, compute, skip)


def mi_diagnostics(setup: StepSetup, state: TrainState, policy, traj: Trajectories, key):
    """The MI diagnostics of the rollout (on schedule): metrics and the carried diagnostics state."""
    cfg = setup.config
    compute = lambda: diagnose(policy, traj, key, cfg.diagnostics, state.diagnostics,
                               group_size=cfg.rollout.group_size, mesh=setup.mesh)
    return on_schedule(cfg.diagnostics.compute_freq, state, compute, state.diagnostics)


def gradient_analysis(setup: StepSetup, state: TrainState, traj: Trajectories):
    """Task vs regularisation gradient norms per reward-std bucket, on the whole rollout
    (before filtering), with this algorithm's advantages and loss settings."""
    cfg, rcfg = setup.config, setup.config.rollout
    batch = batch_from_trajectories(traj)
    batch = update.advantages(setup.learner, state.critic, batch, traj.episode_reward, jnp.int32(rcfg.batch),
                              rcfg.group_size)
    rewards = traj.episode_reward.reshape(rcfg.num_groups, rcfg.group_size)
    buckets = grad_analysis.reward_std_buckets(rewards, cfg.grad_buckets)
    return grad_analysis.gradient_norms(
        setup.learner.policy_graph, state.policy, batch, jnp.arange(rcfg.batch) // rcfg.group_size, buckets,
        cfg.grad_buckets, cfg.algo, temperature=setup.learner.temperature, reference_params=state.reference,
        lora=setup.learner.lora,
        rows_per_bucket=grad_analysis.bucket_capacity(rcfg.num_groups, rcfg.group_size, cfg.grad_buckets))


def filter_groups(setup: StepSetup, state: TrainState, traj: Trajectories, batch, key):
    """The filter's verdict per group (keep mask, loss scale, metrics); the `entropy` metric
    costs one extra forward over the whole batch."""
    cfg, groups, members = setup.config, setup.config.rollout.num_groups, setup.config.rollout.group_size
    token_entropy = token_mask = None
    if cfg.filter.metric == "entropy":
        token_entropy = update.token_entropy(setup.learner, state.policy, batch).reshape(groups, members, -1)
        token_mask = batch.loss_mask.reshape(groups, members, -1)
    return filtering.filter_groups(
        cfg.filter, key, traj.episode_reward.reshape(groups, members), traj.success.reshape(groups, members),
        token_entropy, token_mask)


def kept_first(setup: StepSetup, keep, kept_rows, batch, episode_reward):
    """The batch and rewards with the kept groups' rows first; rows from `kept_rows` on are
    padding, masked out of every loss."""
    rcfg = setup.config.rollout
    group_order = filtering.kept_first(keep)
    row_order = (group_order[:, None] * rcfg.group_size + jnp.arange(rcfg.group_size)[None, :]).reshape(-1)
    batch = setup.learner.rows(jax.tree.map(lambda a: a[row_order], batch))
    row_valid = jnp.arange(rcfg.batch) < kept_rows
    return batch.replace(loss_mask=batch.loss_mask & row_valid[:, None]), episode_reward[row_order]


def update_metrics(algo: AlgoConfig, batch, totals: dict, iterations, kept_rows, loss_scale, lr_factor) -> dict:
    """The update's metrics: per-step means of the optimiser steps' statistics and what ran."""
    denominator = jnp.maximum(iterations, 1).astype(jnp.float32)
    micro_batches = totals.pop("update/micro_batches")
    metrics = {k: jnp.where(iterations > 0, v / denominator, jnp.nan) for k, v in totals.items()}
    metrics.update({
        "update/minibatches": iterations.astype(jnp.float32),
        "update/micro_batches": micro_batches,  # forward/backward passes run (padding skipped)
        "update/kept_rows": kept_rows.astype(jnp.float32),
        "update/loss_scale": loss_scale,  # the batch's; `paper` scales each step by its own ratio (mean: this, linear)
        "update/lr_factor": lr_factor,
        "update/advantage_mean": adv.masked_mean(batch.advantages, batch.loss_mask),
    })
    if algo.uses_critic:
        metrics["critic/return_mean"] = adv.masked_mean(batch.returns, batch.loss_mask)
        metrics["critic/value_mean"] = adv.masked_mean(batch.old_values, batch.loss_mask)
    return metrics


# ----------------------------------------------------------------------------- compiling it


class Trainer:
    """The step compiled for a mesh, and the first state. `setup` holds the static parts;
    every changing value lives in `TrainState`. `step_fn(state, codec, prompt)` is the step
    before compilation (to lower it yourself); `step(state)` the compiled one with this run's
    text tables; `update(state, traj, key)` the compiled filter → advantages → update on a
    given rollout; `play_rollout(...)` the compiled rollout alone."""

    def __init__(self, config: StepConfig, policy: Decoder, env: Environment, env_params: Any, codec: TextCodec,
                 prompt: PromptTemplate, mesh: jax.sharding.Mesh | None = None):
        if config.algo.micro_batch_size == AUTO:
            raise ValueError('algo.micro_batch_size="auto" is chosen before the Trainer is built: pass the config '
                             "through resolve_micro_batch first")
        self.config, self.env, self.env_params, self.codec, self.prompt, self.mesh = (
            config, env, env_params, codec, prompt, mesh)
        self._critic_shape = critic_shape(config, policy)  # the critic as ShapeDtypeStructs (PPO)
        problem = sharding.rows_indivisible(config.rollout.batch, config.algo.mini_batch_size,
                                            sharding.row_shards(mesh))
        if problem:
            raise ValueError(problem)
        learner = make_learner(config, policy, self._critic_shape, mesh)
        self.setup = StepSetup(config=config, env=env, env_params=env_params, learner=learner, mesh=mesh)
        self.step_fn = functools.partial(train_step, self.setup)
        self.compiled_step = self._compile(self.step_fn)
        self.step = lambda state: self.compiled_step(state, self.codec, self.prompt)
        self.update = self._compile(functools.partial(update_step, self.setup))
        self._rollout = jax.jit(functools.partial(play_rollout, self.setup))

    def abstract_state(self, policy: Decoder) -> TrainState:
        """What `init_state(key, policy)` makes, as ShapeDtypeStructs carrying its shardings
        (`policy` abstract or real; nothing allocated)."""
        return abstract_state(self.config, self.setup.learner, policy, self._critic_shape, self.mesh)

    @property
    def policy_graph(self):
        return self.setup.learner.policy_graph

    @property
    def actor_tx(self):
        return self.setup.learner.actor_tx

    @property
    def critic_tx(self):
        return self.setup.learner.critic_tx

    def play_rollout(self, policy_state, key, codec, prompt) -> Trajectories:
        """The step's rollout alone, compiled once per trainer (benchmarks time it, tests read
        it): the same program the step plays."""
        with sharding.tracing_on(self.mesh):
            return self._rollout(policy_state, key, codec, prompt)

    def init_state(self, key: jax.Array, policy: Decoder, critic: ValueModel | None = None) -> TrainState:
        """A fresh state (`fresh_state`): the policy's weights, a critic copied from them (PPO),
        the frozen reference (KL only), optimiser states, and on a mesh everything placed as
        `abstract_state` says, the moments created in place (never whole on one device)."""
        critic = (critic_from_policy(policy) if critic is None else critic) if self.config.algo.uses_critic else None
        critic_state = None if critic is None else nnx.state(critic)
        build = functools.partial(fresh_state, self.config, self.setup.learner)
        if self.mesh is None:
            # Every leaf committed to one device: a state mixing committed leaves (weights loaded with
            # device_put) and uncommitted ones (fresh scalars) comes back from the step all committed,
            # which misses the jit cache and compiles the step a second time.
            return jax.device_put(jax.jit(build)(key, nnx.state(policy), critic_state), jax.devices()[0])
        shapes = abstract_state(self.config, self.setup.learner, policy, critic, self.mesh)
        shardings = jax.tree.map(lambda x: x.sharding, shapes)
        place = lambda s, to: None if s is None else jax.device_put(s, to)
        return jax.jit(build, out_shardings=shardings)(sharding.put_replicated(key, self.mesh),
                                                       place(nnx.state(policy), shardings.policy),
                                                       place(critic_state, shardings.critic))

    def _compile(self, fn):
        if self.mesh is None:
            return jax.jit(fn, donate_argnums=0)

        def compiled(state, *args):
            if not hasattr(compiled, "jitted"):
                shardings = jax.tree.map(lambda x: x.sharding, state)
                compiled.jitted = jax.jit(fn, donate_argnums=0,
                                          out_shardings=(shardings, sharding.replicated(self.mesh)))
            with sharding.tracing_on(self.mesh):
                return compiled.jitted(state, *args)

        return compiled


def critic_shape(config: StepConfig, policy: Decoder):
    """PPO's critic as ShapeDtypeStructs (built like the policy, nothing allocated); None without one."""
    if not config.algo.uses_critic:
        return None
    return nnx.eval_shape(lambda: ValueModel(policy.cfg, rngs=nnx.Rngs(0)))


def make_learner(config: StepConfig, policy: Decoder, critic, mesh) -> update.Learner:
    """The update's static parts: the models' graphs, the optimisers, the algorithm's numbers."""
    return update.Learner(
        policy_graph=nnx.graphdef(policy), critic_graph=None if critic is None else nnx.graphdef(critic),
        actor_tx=optimizer(config.algo.actor_lr, config.algo), critic_tx=optimizer(config.algo.critic_lr, config.algo),
        algo=config.algo, temperature=config.rollout.sampling.temperature or 1.0,
        rows=sharding.rows_constraint(mesh), lora=policy.cfg.lora.rank > 0, dropout=policy.cfg.lora.has_dropout)


def resolve_micro_batch(config: StepConfig, policy: Decoder, env: Environment, env_params: Any, codec: TextCodec,
                        prompt: PromptTemplate, mesh: jax.sharding.Mesh | None = None) -> StepConfig:
    """`config` with algo.micro_batch_size="auto" replaced by the largest micro-batch whose
    compiled forward+backward fits the device beside the train state (`micro_batch.resolve`;
    compiles); a config with a number comes back as it is. Done once, before the `Trainer`:
    the step compiles with a number and the run records it."""
    if config.algo.micro_batch_size != AUTO:
        return config
    critic = critic_shape(config, policy)
    state = abstract_state(config, make_learner(config, policy, critic, mesh), policy, critic, mesh)
    resident = sharding.device_bytes((state.policy, state.policy_opt, state.critic, state.critic_opt, state.reference))
    layout = buffer_layout(env, env_params, codec, prompt, config.rollout)
    algo = micro_batch.resolve(config.algo, policy, layout.length, layout.turns * layout.generation, mesh, resident)
    return dataclasses.replace(config, algo=algo)


def fresh_state(config: StepConfig, learner: update.Learner, key: jax.Array, policy_state: nnx.State,
                critic_state: nnx.State | None) -> TrainState:
    """The train state before step 1, built from the policy's (and PPO's critic's) weights: the
    one builder of it. Pure: `Trainer.init_state` compiles it with the mesh's placements and
    `abstract_state` is its `jax.eval_shape`. The weights are copied (the compiled step donates
    the state's buffers; the caller keeps its model); the KL reference is a copy of the initial
    policy, with LoRA none (the policy's own base with its adapters off, `update.actor_step`)."""
    copy = lambda tree: None if tree is None else jax.tree.map(jnp.copy, tree)
    opt = lambda tx, params: None if params is None else tx.init(learner.opt_params(params))  # LoRA: adapters
    diagnostics = None
    if config.diagnostics is not None:
        diagnostics = DiagnosticsState.create()
    reference = copy(policy_state) if config.algo.uses_reference and not learner.lora else None
    return TrainState(step=jnp.int32(0), key=key, policy=copy(policy_state),
                      policy_opt=opt(learner.actor_tx, policy_state), critic=copy(critic_state),
                      critic_opt=opt(learner.critic_tx, critic_state), reference=reference,
                      empty_streak=jnp.int32(0), diagnostics=diagnostics)


def abstract_state(config: StepConfig, learner: update.Learner, policy: Decoder, critic, mesh) -> TrainState:
    """`fresh_state` of `policy` (abstract or real) as ShapeDtypeStructs, on a mesh carrying the
    shardings `init_state` gives: weights by their partition rules, optimiser moments like their
    parameters, everything else replicated. `critic`: the critic model, abstract or real (PPO),
    or None. What the planner measures and an "auto" micro-batch counts as resident."""
    weights = micro_batch.abstract_params(nnx.state(policy), mesh)
    critic_state = None if critic is None else micro_batch.abstract_params(nnx.state(critic), mesh)
    shapes = jax.eval_shape(functools.partial(fresh_state, config, learner), jax.random.key(0), weights,
                            critic_state)
    if mesh is None:
        return shapes
    at = lambda tree, shardings: jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
    rep = sharding.replicated(mesh)
    optimiser = lambda tx, opt, params: None if opt is None else at(
        opt, sharding.optimizer_shardings(tx, learner.opt_params(params), mesh))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), shapes).replace(
        policy=weights, critic=critic_state, reference=None if shapes.reference is None else weights,
        policy_opt=optimiser(learner.actor_tx, shapes.policy_opt, weights),
        critic_opt=optimiser(learner.critic_tx, shapes.critic_opt, critic_state))


def rollout_metrics(traj: Trajectories) -> dict[str, jax.Array]:
    """What the rollout achieved: success, return, valid-action rate, lengths."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    turns = f32(traj.turn_active.sum())
    return {
        "rollout/success": f32(traj.success).mean(),
        "rollout/return": f32(traj.episode_reward).mean(),
        "rollout/valid_action_rate": f32(traj.turn_valid.sum()) / jnp.maximum(turns, 1.0),
        "rollout/actions": f32(traj.num_actions).mean(),
        "rollout/turns": f32(traj.turn_active.sum(axis=1)).mean(),
        "rollout/response_length": f32(traj.gen_lengths.sum()) / jnp.maximum(turns, 1.0),
        "rollout/reasoning_length": f32(traj.reasoning_lengths.sum()) / jnp.maximum(turns, 1.0),
    }
