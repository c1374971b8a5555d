"""Supervised warm start: teach the built-in model the task format and a competent policy.

Run by `python -m ragen_jax.sft` (`ragen_jax.cli.sft`).

A randomly initialised model never writes a parseable answer, so RL has no signal (every group
gets the same format penalty and SNR filtering rightly drops it). This module writes
demonstrations in exactly the multi-turn format the rollout produces and fits the model to
them:

1. Levels come from the same generator the rollout uses. On the host, each turn re-plans with
   the env's solver (`env.solve`: BFS for the board games) from the current state and takes
   the first `max_actions_per_turn` moves; with probability `noise` the first move of a turn is
   replaced by a random one (sub-optimal moves, so RL has room to improve and the data covers
   recovering from mistakes).
2. The reasoning is the env's template (`env.demo_reasoning`), input-dependent (where the
   player, boxes, targets or goal are, and which way the plan goes; on FrozenLake with
   `--name-blocked` also which moves would step into a hole or a wall), so the warm-started policy starts
   with grounded reasoning — the state the MI diagnostics should see before any collapse.
3. The texts are fed through the real `rollout` with a scripted policy, so the token buffer,
   hole layout and loss mask are exactly those of training. Episodes are generated on a
   deterministic copy of the env (`env.deterministic_params`: FrozenLake `success_rate=1`) so
   the host's plan matches the rollout's states; the policy learns the observation → action
   mapping, which then meets the real (slippery) dynamics in RL.
4. Loss: token-mean negative log-likelihood of the generated tokens (AdamW, cosine decay), on
   minibatches with their holes squeezed out (`batch.compact`: same numbers, shorter sequences).

The fit starts from random weights, or continues from `--init` (e.g. a shipped warm start, with
fresh demonstrations from another `--config.seed`). The result is saved as a checkpoint `train` can
start from (`--config.model.init=DIR`), and `--export DIR` also writes a Hugging Face directory
(how the shipped warm starts were made).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ragen_jax.core.progress import progress_bar, tell
from ragen_jax.envs import registry
from ragen_jax.envs.game import require_solver
from ragen_jax.rl import rounding
from ragen_jax.rl.batch import batch_from_trajectories, compact, policy_logprobs
from ragen_jax.rl.update import accumulate_micro_batches
from ragen_jax.rollout.play import RolloutConfig, Trajectories, initial_states, rollout
from ragen_jax.rollout.policies import ScriptedPolicy

NOISE = 0.1
PLAN_STATES = 200_000  # the solver's search bound per plan (a level beyond it ends that demonstration)


# ----------------------------------------------------------------------------- demonstrations


def plan(env, env_params, state) -> list[int]:
    """The solver's shortest plan from `state` (host arrays); [] when solved or unsolvable."""
    return env.solve(state, env_params, max_states=PLAN_STATES) or []


def demonstration_texts(env, env_params, states, config: RolloutConfig, rng: np.random.Generator,
                        noise: float = NOISE, name_blocked: bool = False) -> list[list[str]]:
    """texts[b][t]: what the policy writes after `<think>` at turn t of episode b."""
    require_solver(env, "the supervised warm start")
    step = jax.jit(env.step, static_argnums=3)
    texts = []
    for b in range(config.batch):
        state = jax.tree.map(lambda a: a[b], states)
        budget, row = config.max_actions_per_traj, []
        for _ in range(config.max_turns):
            if bool(state.done) or budget == 0:
                break
            actions = plan(env, env_params, state)[: min(config.max_actions_per_turn, budget)]
            if not actions:
                break
            if rng.random() < noise:
                actions[0] = int(rng.integers(1, env.num_actions + 1))
            names = [env.action_names[a - 1] for a in actions]
            thought = env.demo_reasoning(state, env_params, names, name_blocked)
            row.append(f" {thought} </think> <answer> {' || '.join(names)} </answer>")
            for a in actions:
                state, _, _, _ = step(jax.random.key(0), state, a, env_params)
            budget -= len(actions)
        texts.append(row)
    return texts


def demonstrations(key, env, env_params, codec, prompt, tokenizer, config: RolloutConfig, noise: float = NOISE,
                   rng: np.random.Generator | None = None, name_blocked: bool = False) -> Trajectories:
    """One batch of demonstration trajectories (`config.batch` episodes, one per group)."""
    rng = rng or np.random.default_rng(0)
    states = initial_states(jax.random.split(key)[0], env, env_params, config)
    texts = demonstration_texts(env, env_params, states, config, rng, noise, name_blocked)
    tokens = np.zeros((config.batch, config.max_turns, config.max_new_tokens), np.int32)
    lengths = np.zeros((config.batch, config.max_turns), np.int32)
    for b, row in enumerate(texts):
        for t, text in enumerate(row):
            ids = tokenizer.encode(text, add_special_tokens=False)[: config.max_new_tokens]
            tokens[b, t, : len(ids)], lengths[b, t] = ids, len(ids)
    return _demo_rollout(key, jnp.asarray(tokens), jnp.asarray(lengths), env, env_params, codec, prompt, config)


def _demo_rollout(key, tokens, lengths, env, env_params, codec, prompt, config):
    fn = _DEMO_ROLLOUTS.get((env.name, env_params, config))
    if fn is None:
        fn = jax.jit(lambda k, tk, ln, c, p: rollout(k, ScriptedPolicy(tk, ln), env, env_params, c, p, config))
        _DEMO_ROLLOUTS[(env.name, env_params, config)] = fn
    return fn(key, tokens, lengths, codec, prompt)


_DEMO_ROLLOUTS: dict = {}


def deterministic(env, env_params):
    """The env's parameters without randomness in the dynamics (FrozenLake: no slip)."""
    return env.deterministic_params(env_params)


# ----------------------------------------------------------------------------- training


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    episodes: int = 8192
    epochs: int = 4
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    noise: float = NOISE
    name_blocked: bool = False  # the reasoning also names the moves into a hole (FrozenLake) or wall (Sokoban)
    seed: int = 0
    compact: bool = True  # squeeze each minibatch's holes out (same loss, shorter rows)

    def __post_init__(self):
        for name in ("episodes", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name}={getattr(self, name)} must be >= 1")
        if self.batch_size > self.episodes:
            raise ValueError(f"sft.batch_size={self.batch_size} must be <= sft.episodes={self.episodes}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"sft.noise={self.noise} must be in [0, 1]")


def optimizer(config: SFTConfig, total_steps: int) -> optax.GradientTransformation:
    """AdamW on a warm-up-cosine schedule over the fit's `total_steps`, gradients clipped to norm 1."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.lr, min(config.warmup_steps, total_steps // 4 + 1),
                                                  total_steps)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=config.weight_decay))


def update_step(graph, tx: optax.GradientTransformation, micro_batch: int | None = None):
    """The fit's compiled step `update(params, opt, minibatch, key=None) -> (params, opt, loss)`:
    one AdamW step on the token-mean NLL of the minibatch's generated tokens (model `graph`),
    its forward and backward over the whole minibatch at once or, with `micro_batch` rows
    fewer than its rows, micro-batch by micro-batch (the gradients summed: the same loss, at
    one micro-batch's activations); added to the weights rounded to nearest, or with a `key`
    bfloat16 weights rounded stochastically (`ragen_jax.rl.rounding`, as the RL update)."""

    @jax.jit
    def update(params, opt, mb, key=None):
        count = jnp.maximum(mb.loss_mask.astype(jnp.float32).sum(), 1.0)

        def loss_fn(p, b, _key=None):
            logp, _ = policy_logprobs(nnx.merge(graph, p), b, 1.0)
            return -jnp.sum(logp * b.loss_mask.astype(jnp.float32)) / count, {}

        if micro_batch is None or micro_batch >= mb.loss_mask.shape[0]:
            (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
        else:
            loss, _, grads, _ = accumulate_micro_batches(loss_fn, params, mb, micro_batch)
        updates, opt = tx.update(grads, opt, params)
        return rounding.apply_updates(params, updates, key), opt, loss

    return update


def fit_micro_batch(batch_size: int, micro_batch_size) -> int | None:
    """The rows a fit's forward and backward take at once: the run config's
    `algo.micro_batch_size` when it is a number below `batch_size` that divides it, None (the
    whole minibatch) when it is 0, "auto" or not below; a ValueError naming both otherwise."""
    if not isinstance(micro_batch_size, int) or not 0 < micro_batch_size < batch_size:
        return None
    if batch_size % micro_batch_size:
        raise ValueError(f"--batch-size={batch_size} must be a multiple of algo.micro_batch_size={micro_batch_size} "
                         "(the fit runs each minibatch in micro-batches of that many rows)")
    return micro_batch_size


def total_steps(config: SFTConfig) -> int:
    """Adam steps of a fit: whole minibatches of `config.episodes` rows, `config.epochs` times."""
    return config.episodes // config.batch_size * config.epochs


def fit(model, data: Trajectories, config: SFTConfig, log=print, progress: bool = False, after_step=None,
        start=None, weight_rounding: str = "nearest", micro_batch: int | None = None):
    """Minimise the token-mean NLL of the demonstrations' generated tokens; returns the losses
    (each epoch's mean over the steps this call ran). `progress`: `train`'s bar on stderr
    (steps, the last step's loss, time spent and left), with the epoch lines above it; a real
    model's fit takes minutes. `after_step(step, params, opt, loss)` runs after every step (the
    command's validation and checkpoints). `start=(step, params, opt)` continues a fit that
    stopped after `step` steps: the same minibatches follow, so it ends where one call would.
    `weight_rounding` "stochastic": bfloat16 weights take each step rounded stochastically, with
    step k's key folded from the seed's (so a continued fit draws the same). `micro_batch`:
    rows per forward and backward (`fit_micro_batch`; None: the whole minibatch)."""
    batch = jax.tree.map(np.asarray, batch_from_trajectories(data))  # minibatches cut on the host
    rows = batch.loss_mask.shape[0]
    steps_per_epoch = rows // config.batch_size
    total = steps_per_epoch * config.epochs
    tx = optimizer(config, total)
    graph, params = nnx.split(model)
    done, params, opt = start if start is not None else (0, params, tx.init(params))
    update = update_step(graph, tx, micro_batch)
    seed_key = jax.random.key(config.seed) if weight_rounding == "stochastic" else None

    rng = np.random.default_rng(config.seed)
    losses = []
    bar = progress_bar(total, "sft", initial=done) if progress else None
    try:
        for epoch in range(config.epochs):
            order = rng.permutation(rows)  # drawn for every epoch, so a continued fit draws the same
            epoch_losses = []
            for i in range(steps_per_epoch):
                step = epoch * steps_per_epoch + i + 1
                if step <= done:
                    continue
                idx = order[i * config.batch_size:(i + 1) * config.batch_size]
                mb = jax.tree.map(lambda a: a[idx], batch)
                key = None if seed_key is None else jax.random.fold_in(seed_key, step)
                params, opt, loss = update(params, opt, compact(mb) if config.compact else mb, key)
                epoch_losses.append(float(loss))
                if bar is not None:
                    bar.set_postfix(loss=f"{epoch_losses[-1]:.4f}", refresh=False)
                    bar.update(1)
                if after_step is not None:
                    after_step(step, params, opt, epoch_losses[-1])
            if epoch_losses:
                losses.append(float(np.mean(epoch_losses)))
                tell(f"epoch {epoch + 1}/{config.epochs}: loss {losses[-1]:.4f}", bar, log)
    finally:
        if bar is not None:
            bar.close()
    nnx.update(model, params)
    return losses


def check_env(env, config: SFTConfig) -> None:
    """One clear line when `env` cannot give these demonstrations: it has no solver, or
    `name_blocked` is asked of an env whose reasoning has no holes or walls to name."""
    if config.name_blocked and env.blocked_kind is None:
        games = [f"{name} ({found.env.blocked_kind})" for name, found in registry.ENVS.items()
                 if found.env is not None and found.env.blocked_kind is not None]
        raise ValueError(f"--name-blocked: {', '.join(games)} only, not env {env.name}")
    require_solver(env, "the supervised warm start")


def warm_start(exp, config: SFTConfig, log=print, progress: bool = False, after_step=None,
               start=None) -> list[float]:
    """Generate `config.episodes` demonstrations for the experiment's env and fit its model
    (`progress`, `after_step`, `start`: as `fit` says; the same seed gives the same data)."""
    check_env(exp.env, config)
    rollout_config = dataclasses.replace(exp.run.step.rollout, num_groups=min(256, config.episodes), group_size=1)
    params = deterministic(exp.env, exp.env_params)
    key = jax.random.key(config.seed)
    rng = np.random.default_rng(config.seed)
    parts, made = [], 0
    started = time.perf_counter()
    while made < config.episodes:
        key, sub = jax.random.split(key)
        parts.append(demonstrations(sub, exp.env, params, exp.codec, exp.prompt, exp.tokenizer, rollout_config,
                                    config.noise, rng, config.name_blocked))
        made += rollout_config.batch
    data = jax.tree.map(lambda *xs: jnp.concatenate(xs)[: config.episodes], *parts)
    success = float(np.mean(np.asarray(data.success)))
    log(f"{config.episodes} demonstrations in {time.perf_counter() - started:.0f} s "
        f"(success {success:.2f}, noise {config.noise})")
    algo = exp.run.step.algo
    return fit(exp.model, data, config, log, progress, after_step, start, algo.weight_rounding,
               fit_micro_batch(config.batch_size, algo.micro_batch_size))
