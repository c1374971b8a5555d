"""One training iteration as one compiled function: `step(state) -> (state, metrics)`.

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

The update works on the compact generated-slot view of the rollout (`ragen_jax.rl.batch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from ragen_jax.envs.base import Environment
from ragen_jax.models.qwen2 import Qwen2, for_inference
from ragen_jax.models.value import ValueModel, critic_from_policy
from ragen_jax.rl import advantages as adv
from ragen_jax.rl import filtering, losses
from ragen_jax.rl.algorithms import AlgoConfig, lr_decay_factor, optimizer
from ragen_jax.rl.batch import Batch, batch_from_trajectories, critic_values, policy_logprobs
from ragen_jax.rollout.play import RolloutConfig, Trajectories, rollout, rollout_on_mesh
from ragen_jax.rollout.policies import model_policy
from ragen_jax.run import sharding
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything static about a training step."""

    rollout: RolloutConfig = RolloutConfig()
    filter: filtering.FilterConfig = filtering.FilterConfig()
    algo: AlgoConfig = AlgoConfig.preset("ppo")
    diagnostics: Any = None  # a diagnostics.diagnose.DiagnosticsConfig, or None for no MI metrics
    # Gradient analysis (docs/method.md#the-gradient-analysis, off by default): task vs
    # regularisation gradient norms in this many reward-std quantile buckets (the paper uses 6),
    # on the diagnostics' schedule (step 1 and every compute_freq steps; every 5 steps without a
    # diagnostics config).
    grad_buckets: int = 0
    # The run's length in train steps (`train.steps`): where `algo.lr_decay_fraction`'s decay ends.
    total_steps: int = 0

    def __post_init__(self):
        self.filter.check_group_size(self.rollout.group_size)
        if self.algo.lr_decay_fraction and self.total_steps < 1:
            raise ValueError(f"algo.lr_decay_fraction={self.algo.lr_decay_fraction} needs the run's length "
                             f"(total_steps={self.total_steps}, must be >= 1)")
        self.algo.check_batch(self.rollout.batch, self.rollout.group_size)
        if self.grad_buckets < 0 or (self.grad_buckets and self.rollout.group_size < 2):
            raise ValueError(f"grad_buckets={self.grad_buckets} must be >= 0, and > 0 only with "
                             f"rollout.group_size >= 2 (got {self.rollout.group_size})")

    @property
    def compute_freq(self) -> int:
        return self.diagnostics.compute_freq if self.diagnostics is not None else 5


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


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """Holds the static parts (model structure, env, text tables, config, mesh) and the
    compiled `step`. All changing values live in `TrainState`."""

    def __init__(self, config: StepConfig, policy: Qwen2, env: Environment, env_params: Any, codec: TextCodec,
                 prompt: PromptTemplate, mesh: jax.sharding.Mesh | None = None):
        self.config, self.env, self.env_params, self.codec, self.prompt, self.mesh = (
            config, env, env_params, codec, prompt, mesh)
        self.policy_graph = nnx.graphdef(policy)
        self.critic_graph = None
        if config.algo.uses_critic:
            self.critic_graph = nnx.graphdef(nnx.eval_shape(lambda: ValueModel(policy.cfg, rngs=nnx.Rngs(0))))
        self.actor_tx = optimizer(config.algo.actor_lr, config.algo)
        self.critic_tx = optimizer(config.algo.critic_lr, config.algo)
        problem = sharding.rows_indivisible(config.rollout.batch, config.algo.mini_batch_size,
                                            sharding.row_shards(mesh))
        if problem:
            raise ValueError(problem)
        self.rows = sharding.rows_constraint(mesh)
        # The text tables (and a QA dataset among them) are arguments, not constants in the graph.
        self.compiled_step = self._compile(self._step)
        self.step = lambda state: self.compiled_step(state, self.codec, self.prompt)
        self.update = self._compile(self._update)

    # ------------------------------------------------------------------ state

    def init_state(self, key: jax.Array, policy: Qwen2, critic: ValueModel | None = None) -> TrainState:
        """A fresh state: the policy's weights, a critic copied from them (PPO), the frozen
        reference (KL only), optimiser states, and on a mesh everything placed by its rules."""
        algo = self.config.algo
        # Copies: the compiled step donates the state's buffers, the caller keeps its model.
        policy_state = jax.tree.map(jnp.copy, nnx.state(policy))
        critic_state = None
        if algo.uses_critic:
            critic_state = (nnx.state(critic_from_policy(policy)) if critic is None
                            else jax.tree.map(jnp.copy, nnx.state(critic)))
        reference = jax.tree.map(jnp.copy, policy_state) if algo.uses_reference else None
        diagnostics = None
        if self.config.diagnostics is not None:
            from ragen_jax.diagnostics.diagnose import DiagnosticsState

            diagnostics = DiagnosticsState.create()
        if self.mesh is not None:
            place = lambda s: None if s is None else jax.device_put(s, sharding.module_shardings(s, self.mesh))
            policy_state, critic_state, reference = place(policy_state), place(critic_state), place(reference)
        def init_opt(tx, params):  # on a mesh, Adam's moments are sharded like their parameters
            if params is None:
                return None
            if self.mesh is None:
                return jax.jit(tx.init)(params)
            return jax.jit(tx.init, out_shardings=sharding.optimizer_shardings(tx, params, self.mesh))(params)

        state = TrainState(
            step=jnp.int32(0), key=key, policy=policy_state, policy_opt=init_opt(self.actor_tx, policy_state),
            critic=critic_state, critic_opt=init_opt(self.critic_tx, critic_state), reference=reference,
            empty_streak=jnp.int32(0), diagnostics=diagnostics,
        )
        if self.mesh is not None:  # scalars and keys replicated; optimiser moments follow their params
            return jax.tree.map(lambda x: x if isinstance(x.sharding, jax.sharding.NamedSharding)
                                else sharding.put_replicated(x, self.mesh), state)
        # Every leaf committed to one device: a state mixing committed leaves (weights loaded with
        # device_put) and uncommitted ones (fresh scalars) comes back from the step all committed,
        # which misses the jit cache and compiles the step a second time.
        return jax.device_put(state, jax.devices()[0])

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

    # ------------------------------------------------------------------ one step

    def _step(self, state: TrainState, codec: TextCodec, prompt: PromptTemplate):
        cfg = self.config
        key, k_rollout, k_update, k_diag = jax.random.split(state.key, 4)
        # the rollout and the diagnostics only run the policy forward: its weights in the compute dtype
        policy = for_inference(nnx.merge(self.policy_graph, state.policy))

        # 1. rollout
        traj = self.play_rollout(state.policy, k_rollout, codec, prompt)
        metrics = rollout_metrics(traj)

        # 2. diagnostics on the current policy, before filtering
        diagnostics = state.diagnostics
        if cfg.diagnostics is not None:
            mi, diagnostics = self._diagnostics(policy, traj, k_diag, state)
            metrics.update(mi)
        if cfg.grad_buckets:
            metrics.update(self._gated(state, lambda: self._grad_analysis(state, traj)))

        # 3-5. filter, advantages, update (shared with `update`, which takes a fixed batch)
        state, update_metrics = self._update(state.replace(key=key, diagnostics=diagnostics), traj, k_update)
        return state, {**metrics, **update_metrics}

    def play_rollout(self, policy_state, key, codec, prompt) -> Trajectories:
        """The step's rollout on its mesh (`rollout_on_mesh`: per device on a data-only mesh)."""
        policy, cfg = for_inference(nnx.merge(self.policy_graph, policy_state)), self.config.rollout
        return rollout_on_mesh(
            lambda part, rows: rollout(key, model_policy(policy, codec, prompt, cfg, part), self.env,
                                       self.env_params, codec, prompt, cfg, shard_rows=rows, part=part),
            cfg.batch, self.mesh)

    def _gated(self, state, compute, carried=None):
        """Run `compute` (-> metrics dict, or (metrics, carried)) at step 1 and every
        compute_freq steps; otherwise NaN metrics and `carried` unchanged."""
        step = state.step + 1  # 1-based index of the step being run
        run = (step == 1) | (step % self.config.compute_freq == 0)
        shapes = jax.eval_shape(compute)
        nan = lambda tree: jax.tree.map(lambda v: jnp.full(v.shape, jnp.nan, v.dtype), tree)
        skip = (lambda: (nan(shapes[0]), carried)) if isinstance(shapes, tuple) else (lambda: nan(shapes))
        return jax.lax.cond(run, compute, skip)

    def _diagnostics(self, policy, traj, key, state):
        from ragen_jax.diagnostics.diagnose import diagnose

        compute = lambda: diagnose(policy, traj, key, self.config.diagnostics, state.diagnostics,
                                   group_size=self.config.rollout.group_size, mesh=self.mesh)
        return self._gated(state, compute, state.diagnostics)

    def _grad_analysis(self, state, traj):
        """Task vs regularisation gradient norms per reward-std bucket, on the whole rollout
        (before filtering), with this algorithm's advantages and loss settings."""
        from ragen_jax.diagnostics import grad_analysis

        cfg, algo, rcfg = self.config, self.config.algo, self.config.rollout
        batch = batch_from_trajectories(traj)
        batch = self._advantages(state, batch, traj.episode_reward, jnp.int32(rcfg.batch))
        rewards = traj.episode_reward.reshape(rcfg.num_groups, rcfg.group_size)
        buckets = grad_analysis.reward_std_buckets(rewards, cfg.grad_buckets)
        return grad_analysis.gradient_norms(
            self.policy_graph, state.policy, batch, jnp.arange(rcfg.batch) // rcfg.group_size, buckets,
            cfg.grad_buckets, entropy_coef=algo.entropy_coef, kl_coef=algo.kl_coef,
            kl_estimator=algo.kl_estimator, reference_params=state.reference,
            temperature=rcfg.sampling.temperature or 1.0, clip_low=algo.clip_low, clip_high=algo.clip_high,
            dual_clip=algo.dual_clip, aggregation=algo.aggregation,
            rows_per_bucket=grad_analysis.bucket_capacity(rcfg.num_groups, rcfg.group_size, cfg.grad_buckets))

    def _update(self, state: TrainState, traj: Trajectories, key: jax.Array):
        """Filter → advantages → minibatch updates over the kept groups; returns the new
        state (step + 1) and the update's metrics. Also callable on a fixed batch."""
        cfg, algo, rcfg = self.config, self.config.algo, self.config.rollout
        groups, members = rcfg.num_groups, rcfg.group_size
        batch = batch_from_trajectories(traj)

        # SNR-aware filter: whole groups kept or dropped
        token_entropy = token_mask = None
        if cfg.filter.metric == "entropy":  # costs one extra forward over the whole batch
            token_entropy = self._token_entropy(state.policy, batch).reshape(groups, members, -1)
            token_mask = batch.loss_mask.reshape(groups, members, -1)
        keep, scale, metrics = filtering.filter_groups(
            cfg.filter, key, traj.episode_reward.reshape(groups, members), traj.success.reshape(groups, members),
            token_entropy, token_mask)
        kept_rows = keep.sum() * members

        # Kept groups first; rows beyond `kept_rows` are padding, masked out of every loss.
        group_order = filtering.kept_first(keep)
        row_order = (group_order[:, None] * members + jnp.arange(members)[None, :]).reshape(-1)
        batch = self.rows(jax.tree.map(lambda a: a[row_order], batch))
        episode_reward = traj.episode_reward[row_order]
        row_valid = jnp.arange(rcfg.batch) < kept_rows
        batch = batch.replace(loss_mask=batch.loss_mask & row_valid[:, None])

        mb = algo.mini_batch_size
        batch = self._advantages(state, batch, episode_reward, kept_rows)
        lr_factor = lr_decay_factor(state.step, cfg.total_steps, algo.lr_decay_fraction)

        # Optimiser steps over the kept rows (`filter.update`): a loop whose trip count depends on
        # how many groups were kept; step i trains on the rows [start, end) of the kept-first
        # order, a window of `mb` rows whose rows past `end` are masked (their micro-batches are
        # not run, `_accumulate`).
        steps = filtering.update_steps(cfg.filter, kept_rows, rcfg.batch, mb)
        temperature = rcfg.sampling.temperature or 1.0
        zero_stats = {name: jnp.float32(0.0) for name in (*UPDATE_STATS, "update/micro_batches")}

        def one_update(i, carry):
            params, opt, critic, critic_opt, totals = carry
            start, end = filtering.step_rows(cfg.filter, i % steps, steps, kept_rows, mb)
            window = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, mb), batch)
            in_step = jnp.arange(mb) < end - start
            # A window picked by a traced index lives on a few devices (the batch is split in
            # contiguous blocks); pin its rows to the whole mesh again, or GSPMD replicates it
            # and every device computes the whole minibatch.
            mbatch = self.rows(window.replace(loss_mask=window.loss_mask & in_step[:, None]))
            step_scale = filtering.step_loss_scale(cfg.filter, scale, end - start, mb)
            params, opt, stats = self._actor_update(params, opt, state.reference, mbatch, step_scale, temperature,
                                                    lr_factor)
            if algo.uses_critic:
                critic, critic_opt, critic_stats = self._critic_update(critic, critic_opt, mbatch, lr_factor)
                stats.update(critic_stats)
            totals = {k: totals[k] + stats.get(k, 0.0) for k in totals}
            return params, opt, critic, critic_opt, totals

        iterations = steps * algo.epochs
        params, opt, critic, critic_opt, totals = jax.lax.fori_loop(
            0, iterations, one_update, (state.policy, state.policy_opt, state.critic, state.critic_opt, zero_stats))

        denominator = jnp.maximum(iterations, 1).astype(jnp.float32)
        micro_batches = totals.pop("update/micro_batches")
        metrics.update({k: jnp.where(iterations > 0, v / denominator, jnp.nan) for k, v in totals.items()})
        metrics.update({
            "update/minibatches": iterations.astype(jnp.float32),
            "update/micro_batches": micro_batches,  # forward/backward passes run (padding skipped)
            "update/kept_rows": kept_rows.astype(jnp.float32),
            "update/loss_scale": scale,  # the batch's; `paper` scales each step by its own ratio (mean: this, linear)
            "update/lr_factor": lr_factor,
            "update/advantage_mean": adv.masked_mean(batch.advantages, batch.loss_mask),
        })
        if algo.uses_critic:
            metrics["critic/return_mean"] = adv.masked_mean(batch.returns, batch.loss_mask)
            metrics["critic/value_mean"] = adv.masked_mean(batch.old_values, batch.loss_mask)
        empty = keep.sum() == 0
        new_state = state.replace(step=state.step + 1, policy=params, policy_opt=opt, critic=critic,
                                  critic_opt=critic_opt, empty_streak=jnp.where(empty, state.empty_streak + 1, 0))
        metrics["filter/empty_streak"] = new_state.empty_streak.astype(jnp.float32)
        return new_state, metrics

    def _token_entropy(self, params, batch: Batch) -> jax.Array:
        """Policy entropy [B, K] at every generated slot, one minibatch at a time."""
        mb = self.config.algo.mini_batch_size
        model = nnx.merge(self.policy_graph, params)
        temperature = self.config.rollout.sampling.temperature or 1.0
        chunks = jax.tree.map(lambda a: _split(a, mb), batch)
        entropy = jax.lax.map(lambda b: policy_logprobs(model, b, temperature)[1], chunks)
        return entropy.reshape(batch.loss_mask.shape)

    def _advantages(self, state, batch: Batch, episode_reward, rows) -> Batch:
        """Fill advantages (and, for PPO, old values and returns) for the first `rows` rows
        (groups whole, in order); the critic runs over those rows only, a minibatch at a time."""
        algo, rcfg = self.config.algo, self.config.rollout
        if not algo.uses_critic:
            rewards = episode_reward.reshape(rcfg.num_groups, rcfg.group_size)
            per_row = adv.group_advantages(rewards, normalise_std=algo.advantage == "grpo").reshape(-1)
            return batch.replace(advantages=adv.broadcast_to_tokens(per_row, batch.loss_mask))
        mb = algo.mini_batch_size
        critic = nnx.merge(self.critic_graph, state.critic)

        def value_pass(i, values):
            v = critic_values(critic, self.rows(jax.tree.map(lambda a: _split(a, mb)[i], batch)))
            return _split(values, mb).at[i].set(v).reshape(values.shape)

        values = jax.lax.fori_loop(0, (rows + mb - 1) // mb, value_pass, jnp.zeros_like(batch.rewards))
        mask = batch.loss_mask & (jnp.arange(batch.loss_mask.shape[0]) < rows)[:, None]
        advantages, returns = adv.gae(batch.rewards, values, mask, algo.gamma, algo.lam)
        return batch.replace(advantages=advantages, returns=returns, old_values=values)

    # ------------------------------------------------------------------ optimiser steps

    def _micro_batches(self, mbatch: Batch) -> Batch:
        micro = self.config.algo.micro_batch
        return jax.tree.map(lambda a: a.reshape((a.shape[0] // micro, micro) + a.shape[1:]), mbatch)

    def _accumulate(self, loss_fn, params, mbatch: Batch):
        """Sum of (loss, aux, grads) over micro-batches, and how many ran; the losses use the
        whole minibatch's normaliser, so the sum is the minibatch loss whatever the micro-batch
        size. Kept rows come first, so the micro-batches after the last one with a loss token
        hold only padding (the filter's dropped groups): their terms are exactly zero, and
        they are not run — with ~30 rows kept of a 64-row minibatch, half the work."""
        micro = self._micro_batches(mbatch)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        count = micro.loss_mask.shape[0]
        has_tokens = micro.loss_mask.reshape(count, -1).any(axis=1)
        needed = jnp.max(jnp.where(has_tokens, jnp.arange(1, count + 1), 0))

        def body(i, acc):
            one = jax.tree.map(lambda a: a[i], micro)
            (loss, aux), grads = grad_fn(params, self.rows(one))  # each micro-batch over the whole mesh
            return jax.tree.map(jnp.add, acc, (loss, aux, grads))

        (loss, aux), grads = jax.eval_shape(grad_fn, params, jax.tree.map(lambda a: a[0], micro))
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss, aux, grads))
        loss, aux, grads = jax.lax.fori_loop(0, needed, body, zeros)
        return loss, aux, grads, needed

    def _actor_update(self, params, opt, reference, mbatch: Batch, scale, temperature, lr_factor):
        algo = self.config.algo
        normaliser = losses.aggregation_normaliser(mbatch.loss_mask, algo.aggregation)
        token_count = jnp.maximum(mbatch.loss_mask.sum(), 1).astype(jnp.float32)

        def loss_fn(p, b: Batch):
            model = nnx.merge(self.policy_graph, p)
            logp, entropy = policy_logprobs(model, b, temperature)
            pg, clipped = losses.policy_loss(logp, b.old_logprobs, b.advantages, b.loss_mask,
                                             clip_low=algo.clip_low, clip_high=algo.clip_high,
                                             dual_clip=algo.dual_clip, aggregation=algo.aggregation,
                                             normaliser=normaliser)
            ent = losses.aggregate(entropy, b.loss_mask, algo.aggregation, normaliser)
            total = scale * pg - algo.entropy_coef * ent
            kl = jnp.float32(0.0)
            if algo.uses_reference:
                ref_logp, _ = policy_logprobs(nnx.merge(self.policy_graph, reference), b, temperature)
                kl = losses.aggregate(losses.kl_penalty(logp, jax.lax.stop_gradient(ref_logp), algo.kl_estimator),
                                      b.loss_mask, algo.aggregation, normaliser)
                total = total + algo.kl_coef * kl
            # token-weighted sums so the accumulated totals are minibatch means
            weight = b.loss_mask.sum() / token_count
            approx_kl = jnp.sum(jnp.where(b.loss_mask, b.old_logprobs - logp, 0.0)) / token_count
            aux = {"actor/pg_loss": pg, "actor/entropy": ent, "actor/kl": kl, "actor/clip_frac": clipped * weight,
                   "actor/approx_kl": approx_kl}
            return total, aux

        loss, aux, grads, micro_batches = self._accumulate(loss_fn, params, mbatch)
        updates, opt = self.actor_tx.update(grads, opt, params)
        params = optax.apply_updates(params, _scaled(updates, lr_factor))
        return params, opt, {**aux, "actor/loss": loss, "actor/grad_norm": optax.global_norm(grads),
                             "update/micro_batches": micro_batches.astype(jnp.float32)}

    def _critic_update(self, params, opt, mbatch: Batch, lr_factor):
        algo = self.config.algo
        normaliser = losses.aggregation_normaliser(mbatch.loss_mask, "token-mean")

        def loss_fn(p, b: Batch):
            values = critic_values(nnx.merge(self.critic_graph, p), b)
            loss = losses.value_loss(values, b.old_values, b.returns, b.loss_mask, clip=algo.value_clip,
                                     normaliser=normaliser)
            return loss, {}

        loss, _, grads, _ = self._accumulate(loss_fn, params, mbatch)
        updates, opt = self.critic_tx.update(grads, opt, params)
        params = optax.apply_updates(params, _scaled(updates, lr_factor))
        return params, opt, {"critic/vf_loss": loss, "critic/grad_norm": optax.global_norm(grads)}


def _scaled(updates, factor):
    """An optimiser's updates times the learning-rate factor (AdamW's update, weight decay
    included, is proportional to its rate)."""
    return jax.tree.map(lambda u: (u * factor).astype(u.dtype), updates)


def _split(a: jax.Array, size: int) -> jax.Array:
    """[B, ...] -> [B / size, size, ...]: minibatches along the leading axis."""
    return a.reshape((a.shape[0] // size, size) + a.shape[1:])


UPDATE_STATS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/kl", "actor/clip_frac", "actor/approx_kl",
                "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")


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
