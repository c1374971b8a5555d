"""From a config to the objects a run needs: env, tokenizer, model, text tables, mesh, trainer.

Shared by the train, evaluate and export commands, so all three see the same model and text
for the same config. Nothing here compiles but the choice of an "auto" micro-batch, which a
training experiment makes once, before anything reads its config; bad paths raise one-line
errors.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import ml_collections

from ragen_jax.envs import registry
from ragen_jax.models import hf, hub, packaged
from ragen_jax.core.sharding import shard_model
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import Decoder, init_model
from ragen_jax.core import distributed, sharding
from ragen_jax.run.checkpoint import CheckpointError, Checkpoints
from ragen_jax.run.config import ConfigError, RunConfig, build, read_saved, with_micro_batch
from ragen_jax.run.schema import ModelSection
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate
from ragen_jax.training.step import Trainer, resolve_micro_batch


@dataclasses.dataclass(frozen=True)
class Experiment:
    run: RunConfig
    env: Any
    env_params: Any
    tokenizer: Any
    codec: TextCodec
    prompt: PromptTemplate
    model: Decoder
    mesh: jax.sharding.Mesh | None

    def trainer(self) -> Trainer:
        """The run's `Trainer` (its micro-batch a number: see `for_training`)."""
        return Trainer(self.run.step, self.model, self.env, self.env_params, self.codec, self.prompt, self.mesh)

    def for_training(self) -> Experiment:
        """This experiment with an algo.micro_batch_size="auto" replaced by the number chosen for
        its model and mesh (compiles; `resolve_micro_batch`): the number its step compiles with
        and config.json records. A number already set: this experiment."""
        run = resolved_micro_batch(self.run, self.model, self.env, self.env_params, self.codec, self.prompt, self.mesh)
        return self if run is self.run else dataclasses.replace(self, run=run)


def resolved_micro_batch(run: RunConfig, model, env, env_params, codec, prompt, mesh) -> RunConfig:
    """`run` with an algo.micro_batch_size="auto" replaced by the number chosen for this model
    (real or abstract) and mesh (`training.step.resolve_micro_batch`, which compiles), in its step
    config and in the values config.json records; `run` itself when it holds a number."""
    step = resolve_micro_batch(run.step, model, env, env_params, codec, prompt, mesh)
    if step.algo.micro_batch_size == run.step.algo.micro_batch_size:
        return run
    return with_micro_batch(run, step.algo.micro_batch_size)


def load_model(m: ModelSection, seed: int, mesh) -> tuple[Decoder, Any]:
    """The policy and its tokenizer: a checkpoint (`model.path`: a Hugging Face directory, a GGUF
    file, `pkg:PACKAGE/FILE` shipped in an installed package, or a Hub id `org/name` fetched
    once into the Hub cache), or the built-in preset with the built-in tokenizer, randomly
    initialised from `seed`; then, if `model.init` names weights, loaded with them."""
    if m.attention == "cudnn" and jax.default_backend() != "gpu":
        raise ConfigError(f"model.attention='cudnn' needs an NVIDIA GPU (this backend: {jax.default_backend()}); "
                          "use xla or einsum")
    if m.path:
        try:
            path = hub.resolve(m.path)  # once: the model and its tokenizer from the same snapshot
            model = hf.load_pretrained(path, mesh, **m.options())
            tokenizer = hf.load_tokenizer(path)
        except (OSError, ValueError) as err:
            raise ConfigError(f"model.path={m.path!r}: {str(err).splitlines()[0]}") from None
    else:
        cfg = DecoderConfig.preset(m.preset, **m.options())
        model = init_model(cfg, jax.random.key(seed))
        tokenizer = hf.load_tokenizer()
        if mesh is not None:
            model = shard_model(model, mesh)
    if m.init:
        load_initial_weights(model, m.init)
    return model, tokenizer


WARM_STARTS = Path(__file__).resolve().parent.parent / "assets" / "warm_start"


def resolve_init(init: str) -> Path:
    """`builtin:<name>` -> the shipped warm start's directory; `pkg:PACKAGE/FILE` -> the file in
    that installed package; anything else is a path."""
    if init.startswith("builtin:"):
        name = init[len("builtin:"):]
        path = WARM_STARTS / name
        if not path.is_dir():
            shipped = sorted(p.name for p in WARM_STARTS.iterdir()) if WARM_STARTS.is_dir() else []
            raise ConfigError(f"model.init={init!r}: no shipped warm start {name!r}; allowed: "
                              f"{', '.join('builtin:' + n for n in shipped) or 'none'}")
        return path
    try:
        return packaged.resolve(init)
    except FileNotFoundError as err:
        raise ConfigError(f"model.init={init!r}: {err}") from None


def load_initial_weights(model: Decoder, init: str) -> None:
    """Overwrite `model`'s weights from `init`: a training or SFT workdir (its latest orbax
    checkpoint), a Hugging Face directory, or `builtin:<name>` (a shipped warm start)."""
    from flax import nnx

    from ragen_jax.models.lora import LoRAParam

    path = resolve_init(init)
    # a LoRA model's base weights come from `init`; its adapters stay fresh (B = 0)
    base = nnx.Not(LoRAParam)
    if (path / "checkpoints").is_dir():
        saved = path / "config.json"
        if saved.is_file() and _lora_run(json.loads(saved.read_text())):
            raise ConfigError(f"model.init={init!r} is a LoRA run: its checkpoints hold adapters, not a whole "
                              "model; export it merged (python -m ragen_jax.export) and start from the export")
        if not restorable_steps(path):
            raise CheckpointError(f"model.init={init!r} has no checkpoint under {path / 'checkpoints'}")
        nnx.update(model, restore_policy(path, None, nnx.state(model, base))[1])
        return
    if not (path / "config.json").is_file() and not hf.is_gguf(path):
        raise ConfigError(f"model.init={init!r} is neither a workdir with checkpoints, a Hugging Face "
                          "directory (config.json + safetensors) nor a GGUF file")
    try:
        source = hf.load_pretrained(path, dtype=model.cfg.dtype, param_dtype=model.cfg.param_dtype,
                                    scan_layers=model.cfg.scan_layers)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.init={init!r}: {str(err).splitlines()[0]}") from None
    want = jax.tree.map(lambda x: x.shape, nnx.state(model, base))
    got = jax.tree.map(lambda x: x.shape, nnx.state(source))
    if want != got:
        raise ConfigError(f"model.init={init!r} holds a model of another shape than model.preset="
                          f"{model.cfg!r:.60}…")
    # (in the model's dtypes: a LoRA model keeps its frozen base weights in the compute dtype)
    nnx.update(model, jax.tree.map(lambda new, old: jax.device_put(new.astype(old.dtype), old.sharding),
                                   nnx.state(source), nnx.state(model, base)))


def _lora_run(config: dict) -> bool:
    """Whether a saved run config (a workdir's config.json) trains LoRA adapters."""
    return bool(((config.get("model") or {}).get("lora") or {}).get("rank"))


def make_experiment(config: RunConfig | ml_collections.ConfigDict, devices=None, training: bool = False) -> Experiment:
    """The run's objects on `devices` (all by default); a ConfigDict is built first (`build`).
    `training`: an algo.micro_batch_size="auto" is chosen now (`Experiment.for_training`)."""
    devices = list(devices if devices is not None else jax.devices())
    run = config if isinstance(config, RunConfig) else build(config, len(devices))
    mesh = None if run.mesh_shape == (1, 1, 1) else sharding.make_mesh(run.mesh_shape, devices)
    env, env_params = registry.make(run.env_name, **run.env_overrides)
    model, tokenizer = load_model(run.settings.model, run.settings.seed, mesh)
    per_turn = run.step.rollout.max_actions_per_turn
    try:
        codec = TextCodec.build(tokenizer, env, per_turn, vocab_size=model.cfg.vocab_size, env_params=env_params)
        prompt = PromptTemplate.build(tokenizer, env, per_turn)
    except ValueError as err:
        raise ConfigError(f"the tokenizer cannot render {run.env_name}: {str(err).splitlines()[0]}") from None
    exp = Experiment(run, env, env_params, tokenizer, codec, prompt, model, mesh)
    return exp.for_training() if training else exp


def restore_run(workdir, step: int | None = None, devices=None) -> tuple[Experiment, int]:
    """The experiment of a training workdir with its policy restored from a checkpoint (the
    latest, or `step`): parameters only, no optimiser state, onto the devices present (the
    saved mesh when it fits them, else data parallelism over all of them)."""
    from pathlib import Path

    from flax import nnx

    workdir = Path(workdir)
    if not workdir.is_dir():
        raise ConfigError(f"workdir {workdir} does not exist")
    saved = workdir / "config.json"
    if not saved.is_file():
        raise ConfigError(f"{saved} does not exist: {workdir} is not a training workdir")
    try:
        config = read_saved(json.loads(saved.read_text()))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{saved} is not valid JSON ({err})") from None
    steps = restorable_steps(workdir)
    if not steps:
        raise CheckpointError(f"{workdir} has no checkpoint (expected {workdir.absolute()}/checkpoints/<step>)")
    if step is not None and step not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {workdir.absolute() / 'checkpoints'} "
                              f"(available: {', '.join(map(str, steps))})")
    devices = list(devices if devices is not None else jax.devices())
    try:
        build(config, len(devices))
    except ConfigError:  # the saved mesh does not fit these devices: plain data parallelism
        config["mesh"] = {"data": -1, "fsdp": 1, "tensor": 1}
    model = config.setdefault("model", {})
    if not _lora_run(config):  # the checkpoint replaces the initial weights (a LoRA run's: its adapters)
        model["init"] = None
    exp = make_experiment(build(config, len(devices)), devices)
    step, policy = restore_policy(workdir, step, nnx.state(exp.model))
    nnx.update(exp.model, policy)
    return exp, step


def restorable_steps(workdir) -> list[int]:
    """The steps of a workdir's checkpoints (none when it has no checkpoints directory)."""
    if not (Path(workdir) / "checkpoints").is_dir():
        return []
    checkpoints = Checkpoints(workdir, read_only=True)
    try:
        return checkpoints.steps()
    finally:
        checkpoints.close()


def restore_policy(workdir, step: int | None, like) -> tuple[int, Any]:
    """(step, policy parameters) of checkpoint `step`, or with None of the newest one that
    restores: each newer one that does not is named in a warning line on stderr."""
    checkpoints = Checkpoints(workdir, read_only=True)
    try:
        if step is not None:
            return step, checkpoints.restore_policy(step, like)
        step, policy, damaged = checkpoints.restore_newest(lambda s: checkpoints.restore_policy(s, like))
    finally:
        checkpoints.close()
    for bad, err in damaged:
        if distributed.is_lead():
            print(f"warning: {err}; using step {step}, the newest checkpoint that restores", file=sys.stderr)
    return step, policy
