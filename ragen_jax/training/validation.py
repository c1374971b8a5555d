"""Validation rollouts (docs/method.md#validation): fixed seeds, `num_envs` levels ×
`samples_per_env` attempts, temperature 0.5; success, mean return, valid-action rate, pass@k.

Every key comes from `EvalConfig.seed` alone: the levels (reset keys) and the sampling keys
are the same at every validation of a run and in `python -m ragen_jax.evaluate`, whatever the
training key, so the same parameters always give the same numbers and two checkpoints are
compared on the same levels.

The rollout is compiled once per static setting (the model's graph, env, env params,
configs, mesh); the parameters and text tables are arguments, so validating new weights
never recompiles (`render_trajectories`: ragen_jax.rollout.render):

    validator = Validator(model, env, env_params, codec, prompt, EvalConfig(), train_rollout)
    metrics, traj = validator(nnx.state(model))          # or the train state's `policy`
    print(render_trajectories(traj, tokenizer, action_names=env.action_names,
                              group_size=validator.rollout.group_size))

pass@k: each level is attempted k = `samples_per_env` times (a group sharing the initial
state); pass@k is the fraction of levels solved at least once. With k = 1 it equals success.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax.envs.base import Environment
from ragen_jax.models import sampling
from ragen_jax.models.stacking import for_inference
from ragen_jax.rollout.play import RolloutConfig, RowPart, Trajectories, initial_states, rollout, rollout_on_mesh
from ragen_jax.rollout.policies import Policy, model_policy
from ragen_jax.core import sharding
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate
from ragen_jax.training.step import rollout_metrics


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Static validation settings; turn and token budgets come from the training rollout."""

    num_envs: int = 32  # levels (groups)
    samples_per_env: int = 1  # attempts per level: the k of pass@k
    temperature: float = 0.5
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 1234  # the only source of the levels and of the sampling keys

    def __post_init__(self):
        for name, low in (("num_envs", 1), ("samples_per_env", 1), ("top_k", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"eval.{name}={value!r} must be an integer >= {low}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"eval.temperature={self.temperature!r} must be a finite number >= 0 (0: greedy)")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"eval.top_p={self.top_p!r} must be in (0, 1]")

    @property
    def sampling(self) -> sampling.SamplingParams:
        return sampling.SamplingParams(temperature=float(self.temperature), top_p=float(self.top_p),
                                       top_k=int(self.top_k))

    def rollout_config(self, train_rollout: RolloutConfig) -> RolloutConfig:
        """The validation rollout: `num_envs` groups of `samples_per_env`, this config's
        sampling, and the training rollout's turns, action budgets, tokens per turn and format
        penalty (so validation measures the task the policy is trained on). Env noise is drawn
        independently per sample (`shared_env_noise` off): the samples of a level are independent
        attempts, as pass@k assumes. Every token is drawn with this config's sampling (a training
        `action_sampling` is exploration, not part of the policy validated)."""
        return dataclasses.replace(train_rollout, num_groups=int(self.num_envs), group_size=int(self.samples_per_env),
                                   sampling=self.sampling, action_sampling=None, shared_env_noise=False)

    def key(self) -> jax.Array:
        """The validation rollout's key: `rollout` resets the levels with `split(key)[0]`."""
        return jax.random.key(int(self.seed))

    def start_states(self, env: Environment, env_params: Any, train_rollout: RolloutConfig):
        """The validation rollout's start state of every row, on the host (for host-side
        analyses of the validation levels: solvers, ceilings, plan grading)."""
        config = self.rollout_config(train_rollout)
        return jax.device_get(initial_states(jax.random.split(self.key())[0], env, env_params, config))


def validation_metrics(traj: Trajectories, samples_per_env: int) -> dict[str, jax.Array]:
    """success, return, valid_action_rate, actions, turns, response_length, reasoning_length
    (the training rollout's metrics without their prefix) and pass@k, as f32 scalars."""
    metrics = {name.split("/", 1)[1]: value for name, value in rollout_metrics(traj).items()}
    solved = traj.success.reshape(-1, samples_per_env).any(axis=1)
    metrics["pass@k"] = solved.astype(jnp.float32).mean()
    return metrics


def validation_rollout(
    policy_for: Callable[[RowPart | None], Policy],
    env: Environment,
    env_params: Any,
    codec: TextCodec,
    prompt: PromptTemplate,
    eval_config: EvalConfig,
    train_rollout_config: RolloutConfig,
    mesh: jax.sharding.Mesh | None = None,
    key: jax.Array | None = None,
) -> tuple[dict[str, jax.Array], Trajectories]:
    """Traceable: the validation rollout of any policy (`policy_for(part)`: a model's, or a
    scripted one in tests) and its metrics as f32 scalars, on `mesh` as the train step's
    (`rollout_on_mesh`: per device on a data-only mesh). Keys from `eval_config.seed` only
    (`key`: that seed's `eval_config.key()`, passed in so the seed is not compiled in)."""
    config = eval_config.rollout_config(train_rollout_config)
    key = eval_config.key() if key is None else key
    traj = rollout_on_mesh(
        lambda part, rows: rollout(key, policy_for(part), env, env_params, codec, prompt, config,
                                   shard_rows=rows, part=part),
        config.batch, mesh)
    return validation_metrics(traj, config.group_size), traj


@functools.partial(jax.jit, static_argnames=("graph", "env", "env_params", "eval_config", "train_rollout_config",
                                             "mesh"))
def _validate_compiled(params_state, codec, prompt, key, *, graph, env, env_params, eval_config,
                       train_rollout_config, mesh):
    """The compiled validation: jit's cache holds one executable per static setting (graph,
    env, env params, configs without the seed, mesh), shared by every `Validator` and
    `validate` call; the seed's key is an argument, so other levels do not recompile."""
    model = for_inference(nnx.merge(graph, params_state))  # only run forward
    config = eval_config.rollout_config(train_rollout_config)
    return validation_rollout(lambda part: model_policy(model, codec, prompt, config, part), env, env_params,
                              codec, prompt, eval_config, train_rollout_config, mesh, key)


class Validator:
    """Validation of one policy architecture: `validator(params_state)` -> (metrics as python
    floats, Trajectories). The first call compiles; later calls (new weights) do not.

    `policy_model` gives the graph (its weights are not kept); `params_state` is an
    `nnx.State` of that graph, e.g. `nnx.state(model)` or a train state's `policy`. With a
    `mesh`, trajectory rows are split over its data×fsdp axes like the train step's.
    """

    def __init__(self, policy_model: nnx.Module, env: Environment, env_params: Any, codec: TextCodec,
                 prompt: PromptTemplate, eval_config: EvalConfig = EvalConfig(),
                 train_rollout_config: RolloutConfig = RolloutConfig(), mesh: jax.sharding.Mesh | None = None):
        self.graph = nnx.graphdef(policy_model)
        self.env, self.env_params, self.codec, self.prompt, self.mesh = env, env_params, codec, prompt, mesh
        self.eval_config, self.train_rollout_config = eval_config, train_rollout_config
        self.rollout = eval_config.rollout_config(train_rollout_config)

    def __call__(self, params_state: nnx.State) -> tuple[dict[str, float], Trajectories]:
        with sharding.tracing_on(self.mesh):
            metrics, traj = _validate_compiled(params_state, self.codec, self.prompt, self._key(), **self._static())
        return {name: float(value) for name, value in jax.device_get(metrics).items()}, traj

    def lower(self, params_state: nnx.State):
        """The validation program lowered for `params_state` (arrays or ShapeDtypeStructs with
        shardings: `.compile()` it for devices that need not be attached, e.g. a TPU topology's)."""
        with sharding.tracing_on(self.mesh):
            # the key's type without making one: on a mesh of compile-only devices (a TPU
            # topology's) nothing can run, not even the seed's conversion to a key
            key = jax.ShapeDtypeStruct((), jax.eval_shape(self.eval_config.key).dtype,
                                       sharding=None if self.mesh is None else sharding.replicated(self.mesh))
            return _validate_compiled.lower(params_state, self.codec, self.prompt, key, **self._static())

    def _key(self) -> jax.Array:
        key = self.eval_config.key()
        return key if self.mesh is None else sharding.put_replicated(key, self.mesh)

    def _static(self) -> dict:
        return dict(graph=self.graph, env=self.env, env_params=self.env_params,
                    eval_config=dataclasses.replace(self.eval_config, seed=0),
                    train_rollout_config=self.train_rollout_config, mesh=self.mesh)


def validate(
    policy_model: nnx.Module,
    env: Environment,
    env_params: Any,
    codec: TextCodec,
    prompt: PromptTemplate,
    eval_config: EvalConfig = EvalConfig(),
    train_rollout_config: RolloutConfig = RolloutConfig(),
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[dict[str, float], Trajectories]:
    """One validation of `policy_model`'s current weights: (metrics, Trajectories).

    Metrics (python floats): success, return, valid_action_rate, actions, turns,
    response_length, reasoning_length, pass@k (k = eval_config.samples_per_env). The compiled
    rollout is shared with every `Validator` of the same static setting, so calling this again
    with new weights of the same model does not recompile.
    """
    validator = Validator(policy_model, env, env_params, codec, prompt, eval_config, train_rollout_config, mesh)
    return validator(nnx.state(policy_model))


# ----------------------------------------------------------------------------- readable text
