"""Every program the commands run, compiled ahead of time for a mesh with nothing allocated
(`python -m ragen_jax.plan --target v5e-1 --programs`): the train step, validation (also the
first half of `evaluate`), evaluation's diagnostics, and the supervised fit's step.

With a TPU target this is the TPU compiler's word, before a TPU is rented, that each program
lowers for the chip and fits its memory; on the host it checks the same for its devices. Each
program is compiled with the shapes a run of the config gives it: the train state's
shardings, validation's `eval` section, the evaluation's diagnostics on validation's rollout,
the fit's minibatch of `sft` demonstrations over the same token buffer, in the config's micro-batches.
"""

from __future__ import annotations

import dataclasses
import time

from ragen_jax.analysis import planner
from ragen_jax.training.micro_batch import gib

PROGRAMS = ("train step", "validation", "evaluation diagnostics", "supervised fit step")


@dataclasses.dataclass
class Compiled:
    """One program's compile: seconds, the compiler's memory per device (argument, output,
    alias, temp, peak) or what it said it needs when the program does not fit."""

    seconds: float
    memory: dict | None
    does_not_fit: dict | None

    def line(self, name: str) -> str:
        if self.memory is None:
            need = self.does_not_fit
            return (f"  {name:24s} does not fit: needs {'' if need['whole'] else 'more than '}"
                    f"{gib(need['need'])} of {gib(need['available'])}   ({self.seconds:.0f} s)")
        return (f"  {name:24s} compiled, peak {gib(self.memory['peak'])} per device   "
                f"({self.seconds:.0f} s)")


def compile_programs(config, mesh_shape, preset: str | None, devices, log=lambda *a: None) -> dict[str, Compiled]:
    """Compile each of `PROGRAMS` for `config` on a `mesh_shape` mesh of `devices`
    (`planner.abstract_trainer` says how both default)."""
    with planner.not_written_to_disk_cache():
        return _compile_programs(config, mesh_shape, preset, devices, log)


def _compile_programs(config, mesh_shape, preset, devices, log) -> dict[str, Compiled]:
    import jax
    from flax import nnx

    from ragen_jax.diagnostics.diagnose import DiagnosticsState, diagnose, evaluation_config
    from ragen_jax.models.stacking import for_inference
    from ragen_jax.core import sharding
    from ragen_jax.training import micro_batch, sft
    from ragen_jax.training.validation import Validator

    cfg, _, mesh, trainer, layout, run = planner.abstract_trainer(config, mesh_shape, preset, devices)
    model = planner.abstract_model(cfg)
    graph = nnx.graphdef(model)
    state = trainer.abstract_state(model)
    out = {}

    def compile_one(name, lower):
        log(f"compiling {name} ...")
        started = time.perf_counter()
        compiled, oom = planner.compiled_or_oom(lambda: lower().compile())
        out[name] = Compiled(time.perf_counter() - started, compiled and planner.memory_figures(compiled), oom)
        return compiled

    seconds = {}
    log("compiling the train step ...")
    step, oom = planner.compile_train_step(trainer, state, mesh, seconds)
    out["train step"] = Compiled(seconds["train step"], step, oom)

    e = run.settings.eval
    validator = Validator(model, trainer.env, trainer.env_params, trainer.codec, trainer.prompt, e, run.step.rollout,
                          mesh)
    validation = compile_one("validation", lambda: validator.lower(state.policy))

    if validation is not None:  # evaluation scores the validation rollout's trajectories
        traj = jax.tree.map(lambda info, where: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=where),
                            validation.out_info[1], validation.output_shardings[1])
        k = e.samples_per_env
        d = run.settings.diagnostics
        mi_config = evaluation_config(e.num_envs * k, d.score_rows, d.span_buckets)

        def evaluation(params, traj, key):
            inference = for_inference(nnx.merge(graph, params))
            return diagnose(inference, traj, key, mi_config, DiagnosticsState.create(), group_size=k, mesh=mesh)

        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))

        def lower_evaluation():
            with sharding.tracing_on(mesh):
                return jax.jit(evaluation).lower(state.policy, traj, key)

        compile_one("evaluation diagnostics", lower_evaluation)

    fit = sft.SFTConfig()
    tx = sft.optimizer(fit, 100)
    params = state.policy
    opt = jax.eval_shape(jax.jit(tx.init, out_shardings=sharding.optimizer_shardings(tx, params, mesh)), params)
    batch = micro_batch.micro_batch_inputs(fit.batch_size, layout.length, layout.turns * layout.generation, mesh)

    micro = sft.fit_micro_batch(fit.batch_size, run.step.algo.micro_batch_size)  # as `sft` runs it

    def lower_fit():
        with sharding.tracing_on(mesh):
            return sft.update_step(graph, tx, micro).lower(params, opt, batch)

    compile_one("supervised fit step", lower_fit)
    return out
