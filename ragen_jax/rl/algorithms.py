"""The four update recipes of docs/method.md#the-algorithms as presets of one frozen config.

| algo    | advantage                         | loss aggregation    | clip (low/high) | critic |
| ------- | --------------------------------- | ------------------- | --------------- | ------ |
| ppo     | GAE (γ=1, λ=1) with a critic      | token-mean          | 0.2 / 0.28      | yes    |
| grpo    | (R − group mean)/(group std+1e-6) | seq-mean-token-mean | 0.2 / 0.28      | no     |
| drgrpo  | R − group mean                    | seq-mean-token-sum  | 0.2 / 0.28      | no     |
| dapo    | (R − group mean)/(group std+1e-6) | token-mean          | 0.2 / 0.28      | no     |

Shared defaults: actor lr 1e-6, critic lr 1e-5, entropy coefficient 0.001, KL coefficient 0
(k1 or k3 when it is set; DAPO refuses a KL term), minibatches of 32 trajectories, one epoch.
`AlgoConfig.preset(name, **overrides)` builds one; every field can still be overridden.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from ragen_jax.rl.losses import AGGREGATIONS, KL_ESTIMATORS
from ragen_jax.rl.rounding import WEIGHT_ROUNDINGS

AUTO = "auto"  # algo.micro_batch_size: the largest micro-batch that fits the device
ALGORITHMS = ("ppo", "grpo", "drgrpo", "dapo")
ADAM_MOMENTS = ("param", "bfloat16")
ADVANTAGES = ("gae", "grpo", "drgrpo")
# Each algorithm's advantage and loss aggregation, used where the config leaves them unset.
RECIPES = {
    "ppo": dict(advantage="gae", aggregation="token-mean"),
    "grpo": dict(advantage="grpo", aggregation="seq-mean-token-mean"),
    "drgrpo": dict(advantage="drgrpo", aggregation="seq-mean-token-sum"),
    "dapo": dict(advantage="grpo", aggregation="token-mean"),
}


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    name: str = "ppo"
    advantage: str | None = None  # None: the algorithm's (RECIPES)
    aggregation: str | None = None  # None: the algorithm's (RECIPES)
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    entropy_coef: float = 0.001
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    gamma: float = 1.0
    lam: float = 1.0
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    lr_warmup: int = 0  # optimiser updates over which the learning rate rises linearly from 0 (0: none)
    adam_eps: float = 1e-8  # Adam's denominator floor: parameters whose gradient RMS is below it move less than lr
    # Adam's two moments stored in each parameter's dtype ("param") or in bfloat16 (half the
    # optimiser's memory for float32 weights; the update itself is computed in float32)
    adam_moments: str = "param"
    # how an update is added to bfloat16 weights (`model.param_dtype=bfloat16`): "nearest", or
    # "stochastic" so that steps below a weight's precision still move it on average
    # (ragen_jax/rl/rounding.py); float32 weights are rounded to nearest either way
    weight_rounding: str = "nearest"
    lr_decay_fraction: float = 0.0  # the last part of the run over which both rates fall linearly to 0 (0: none)
    value_clip: float = 0.5
    mini_batch_size: int = 32  # trajectories per optimiser step
    # trajectories per forward/backward (0, or >= the minibatch: all of it); "auto": the largest
    # that the compiled memory analysis says fits the device, chosen once when the step is built
    # (ragen_jax/training/micro_batch.py)
    micro_batch_size: int | str = 0
    micro_batch_memory_gib: float = 0.0  # the device memory "auto" fits into (0: the device's own limit)
    epochs: int = 1

    @classmethod
    def preset(cls, name: str, **overrides) -> "AlgoConfig":
        return cls(name=name, **overrides)

    def __post_init__(self):
        if self.name in RECIPES:  # an unknown name is reported below
            for field, value in RECIPES[self.name].items():
                if getattr(self, field) is None:
                    object.__setattr__(self, field, value)
        for field, allowed in (("name", ALGORITHMS), ("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS),
                               ("kl_estimator", KL_ESTIMATORS), ("adam_moments", ADAM_MOMENTS),
                               ("weight_rounding", WEIGHT_ROUNDINGS)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"algo.{field}={value!r} is not supported; allowed: {', '.join(allowed)}")
        for field in ("clip_low", "clip_high", "entropy_coef", "kl_coef", "weight_decay", "value_clip"):
            if getattr(self, field) < 0:
                raise ValueError(f"algo.{field}={getattr(self, field)} must be >= 0")
        for field in ("actor_lr", "critic_lr", "grad_clip", "adam_eps"):
            if not getattr(self, field) > 0:
                raise ValueError(f"algo.{field}={getattr(self, field)} must be > 0")
        for field in ("gamma", "lam"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"algo.{field}={getattr(self, field)} must be in [0, 1]")
        if self.lr_warmup < 0:
            raise ValueError(f"algo.lr_warmup={self.lr_warmup} must be >= 0 (optimiser updates; 0: no warm-up)")
        if not 0.0 <= self.lr_decay_fraction <= 1.0:
            raise ValueError(f"algo.lr_decay_fraction={self.lr_decay_fraction} must be in [0, 1] "
                             "(the last part of the run's train steps; 0: no decay)")
        if self.mini_batch_size < 1 or self.epochs < 1:
            raise ValueError(
                f"algo.mini_batch_size={self.mini_batch_size}, algo.epochs={self.epochs} must be >= 1")
        micro = self.micro_batch_size
        if micro != AUTO and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 0):
            raise ValueError(f"algo.micro_batch_size={micro!r} must be an integer >= 0 or 'auto'")
        if not (math.isfinite(self.micro_batch_memory_gib) and self.micro_batch_memory_gib >= 0):
            raise ValueError(f"algo.micro_batch_memory_gib={self.micro_batch_memory_gib} must be >= 0 "
                             "(GiB per device; 0: the device's own limit)")
        if micro != AUTO and self.mini_batch_size % self.micro_batch:
            raise ValueError(
                f"algo.micro_batch_size={self.micro_batch_size} must divide algo.mini_batch_size={self.mini_batch_size}"
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"algo.dual_clip={self.dual_clip} must be > 1 (or None)")
        if self.name == "dapo" and self.kl_coef:
            raise ValueError(f"algo.kl_coef={self.kl_coef}: DAPO trains without a KL term (set it to 0)")
        if self.name == "ppo" and self.advantage != "gae":
            raise ValueError(f"algo.advantage={self.advantage!r}: PPO uses the critic's GAE ('gae')")
        if self.name != "ppo" and self.advantage == "gae":
            raise ValueError("algo.advantage='gae' needs a critic: only algo.name='ppo' trains one")

    @property
    def uses_critic(self) -> bool:
        return self.advantage == "gae"

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def micro_batch(self) -> int:
        """Rows per forward/backward: `micro_batch_size`, or the whole minibatch when it is 0 or
        at least the minibatch (a config's micro-batches stay valid when a smaller minibatch is
        set on the command line). "auto" must have been resolved (`Trainer` does it)."""
        if self.micro_batch_size == AUTO:
            raise ValueError("algo.micro_batch_size='auto' is resolved when the train step is built "
                             "(training.step.Trainer); this config has not been")
        return min(self.micro_batch_size, self.mini_batch_size) or self.mini_batch_size

    def check_batch(self, batch: int, group_size: int) -> None:
        """The rollout batch must split into whole minibatches; group baselines need groups."""
        if batch % self.mini_batch_size:
            raise ValueError(
                f"algo.mini_batch_size={self.mini_batch_size} must divide the rollout batch "
                f"(num_groups × group_size = {batch})"
            )
        if self.advantage in ("grpo", "drgrpo") and group_size < 2:
            raise ValueError(
                f"algo.name={self.name!r} normalises rewards within a group: rollout.group_size must be >= 2 "
                f"(got {group_size})"
            )


def lr_decay_factor(step: jax.Array, total_steps: int, fraction: float) -> jax.Array:
    """The learning-rate multiplier of the train step with 0-based index `step`: 1 until the
    last `fraction` of a `total_steps` run (D = fraction · total_steps steps), then
    (total_steps − step) / D, falling linearly to 1/D in the last step (warm-up-stable-decay).
    A constant rate leaves the policy bouncing around where RL has taken it; letting the rate
    fall settles it (Sokoban, 3 seeds: +11.2 to +12.1 points at a constant rate, +12.3 to
    +12.9 with the last 150 of 400 steps falling, docs/tuning.md). A
    multiplier of the whole update, applied per train step and not per optimiser update, so it
    needs no optimiser state and the decay does not depend on how many minibatches the filter
    leaves."""
    if not fraction:
        return jnp.float32(1.0)
    remaining = (total_steps - jnp.asarray(step)).astype(jnp.float32)
    return jnp.clip(remaining / (fraction * total_steps), 0.0, 1.0)


def optimizer(lr: float, config: AlgoConfig) -> optax.GradientTransformation:
    """AdamW after global-norm clipping (verl's actor and critic defaults).

    With `lr_warmup` > 0 the rate rises linearly from 0 over that many optimiser updates: Adam's
    first updates move every parameter by about the full rate whatever its gradient (the
    second-moment estimate rests on one or two gradients), which at lr 2e-4 costs the tiny
    warm starts their success in the first ~10 RL steps (docs/tuning.md, "Levers on Sokoban"). Without a warm-up
    the rate is a constant, so the optimiser state keeps its layout and older checkpoints resume.

    `adam_eps` is Adam's denominator floor (optax's 1e-8 by default): a parameter whose gradient
    RMS is well below it moves by less than the rate, one well above it by about the rate.

    `adam_moments="bfloat16"` stores both moments in bfloat16 (`adam_in_bfloat16`); AdamW is
    otherwise the same chain as optax's: Adam's scaling, decoupled weight decay, the rate."""
    rate = optax.linear_schedule(0.0, lr, config.lr_warmup) if config.lr_warmup else lr
    if config.adam_moments == "param":
        adam = optax.adamw(rate, b1=0.9, b2=0.999, eps=config.adam_eps, weight_decay=config.weight_decay)
    else:
        adam = optax.chain(adam_in_bfloat16(b1=0.9, b2=0.999, eps=config.adam_eps),
                           optax.add_decayed_weights(config.weight_decay), optax.scale_by_learning_rate(rate))
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), adam)


def adam_in_bfloat16(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """optax's Adam scaling with its moments stored in bfloat16: each update reads them back as
    float32, computes Adam's step there, and rounds the new moments to bfloat16 to store."""
    base = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
    to = lambda dtype: (lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree))

    def init(params):
        state = base.init(params)
        return state._replace(mu=to(jnp.bfloat16)(state.mu), nu=to(jnp.bfloat16)(state.nu))

    def update(updates, state, params=None):
        updates, state = base.update(updates, state._replace(mu=to(jnp.float32)(state.mu),
                                                             nu=to(jnp.float32)(state.nu)), params)
        return updates, state._replace(mu=to(jnp.bfloat16)(state.mu), nu=to(jnp.bfloat16)(state.nu))

    return optax.GradientTransformation(init, update)
