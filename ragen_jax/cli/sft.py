"""`python -m ragen_jax.sft --config configs/sokoban_tiny.py --workdir DIR [--episodes N] [--epochs E] [--batch-size B] [--lr LR] [--init W] [--name-blocked] [--eval-every K] [--export HF_DIR]`

Supervised warm start from solver demonstrations (`ragen_jax.training.sft` says how), saved as
a checkpoint that `train` can start from (`--config.model.init=DIR`). The fit shows `train`'s
progress bar on stderr (steps, loss, time left; off with `--config.logging.progress=false`).

`--eval-every K` validates on the config's fixed levels every K steps (success, and for
templated reasoning how often the stated player cell is right), appends the figures with the
fit's minutes to DIR/sft_metrics.jsonl, and checkpoints. Run again with the same arguments, a
stopped fit continues from its last checkpoint, with the same minibatches it would have had.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core import compile_cache, quiet, sharding
from ragen_jax.core.distributed import to_host
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import check_writable_dir, describe, write_atomically
from ragen_jax.diagnostics.reasoning_check import validation_metrics
from ragen_jax.training.sft import (SFTConfig, check_env, fit_micro_batch, optimizer, total_steps,
                                   warm_start)

METRICS, SETTINGS = "sft_metrics.jsonl", "sft.json"


def main(argv=None) -> int:
    quiet.commands()
    from ragen_jax.cli.args import load_config, parse_args
    from ragen_jax.run.checkpoint import CheckpointError
    from ragen_jax.run.config import to_json
    from ragen_jax.run.experiment import make_experiment

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--episodes", type=int, default=SFTConfig.episodes)
    parser.add_argument("--epochs", type=int, default=SFTConfig.epochs)
    parser.add_argument("--lr", type=float, default=SFTConfig.lr)
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size, help="episodes per Adam step")
    parser.add_argument("--noise", type=float, default=SFTConfig.noise)
    parser.add_argument("--name-blocked", "--name-holes", dest="name_blocked", action="store_true",
                        help="the reasoning also names the moves into a hole (FrozenLake) or a wall (Sokoban) next "
                        "to the player (docs/tuning.md, naming the holes)")
    parser.add_argument("--init", default=None, help="continue from these weights (a workdir, a Hugging Face "
                        "directory or builtin:<name>) instead of random ones")
    parser.add_argument("--eval-every", type=int, default=0, help="validate, record and checkpoint every K "
                        "steps (0: at the end only)")
    parser.add_argument("--export", default="", help="also write a Hugging Face directory here")
    extra, rest = parser.parse_known_args(argv)
    args, overrides = parse_args(rest, "Supervised warm start from solver demonstrations.")
    workdir = Path(args.workdir)
    try:
        if extra.eval_every < 0:
            raise ConfigError(f"--eval-every={extra.eval_every} must be >= 0 (0: validate at the end only)")
        config = load_config(args.config, overrides)
        with config.unlocked():
            config.model.init = extra.init  # the configs' own warm start is not where a fit begins
        exp = make_experiment(config)
        # `--config.seed` picks the demonstrations' levels and noise and the minibatch order
        sft = SFTConfig(episodes=extra.episodes, epochs=extra.epochs, batch_size=extra.batch_size, lr=extra.lr,
                        noise=extra.noise, name_blocked=extra.name_blocked, seed=exp.run.settings.seed)
        check_env(exp.env, sft)  # a solver, and holes or walls to name if asked
        fit_micro_batch(sft.batch_size, exp.run.step.algo.micro_batch_size)  # the fit's micro-batches divide it
        check_writable_dir(workdir, "--workdir")
        settings = {"config": json.loads(to_json(exp.run.values)), "sft": dataclasses.asdict(sft)}
        done = check_resumable(workdir, settings)
    except (ConfigError, CheckpointError, ValueError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    compile_cache.enable()
    log = lambda message: print(message, file=sys.stderr)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        write_atomically(workdir / "config.json", to_json(exp.run.values))
        write_atomically(workdir / SETTINGS, json.dumps(settings["sft"], indent=2, sort_keys=True))
        recorder = FitRecorder(exp, sft, workdir, extra.eval_every, log)
        try:
            start = recorder.resume(done)
            warm_start(exp, sft, log, progress=exp.run.settings.logging.progress, after_step=recorder,
                       start=start)  # train's bar, and its switch
        finally:
            recorder.close()
        if extra.export:
            from ragen_jax.models import hf

            hf.save_pretrained(exp.model, extra.export, tokenizer=exp.tokenizer)
    except CheckpointError as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk (CheckpointWriteError is one too)
        print(f"error: {describe(err)}", file=sys.stderr)
        return 1
    log(f"wrote {workdir}/checkpoints/{total_steps(sft)}" + (f" and {extra.export}" if extra.export else ""))
    return 0


def check_resumable(workdir: Path, settings: dict) -> int:
    """The step a fit in `workdir` stopped at (0 for a new one); a ConfigError when the workdir
    holds checkpoints of another fit, another config or a `train` run. Writes nothing."""
    from ragen_jax.run.config import differences

    checkpoints = workdir / "checkpoints"
    if not (checkpoints.is_dir() and any(checkpoints.iterdir())):
        return 0
    if not (workdir / SETTINGS).is_file():
        raise ConfigError(f"workdir {workdir} already has checkpoints that are not a supervised fit's; "
                          "use a new --workdir")
    try:
        saved = {"config": json.loads((workdir / "config.json").read_text()),
                 "sft": json.loads((workdir / SETTINGS).read_text())}
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"workdir {workdir}: its config.json or {SETTINGS} is unreadable ({describe(err)}); "
                          "use a new --workdir") from None
    changes = differences(saved["config"], settings["config"]) + [
        f"sft.{key}: {saved['sft'].get(key)!r} -> {value!r}" for key, value in settings["sft"].items()
        if saved["sft"].get(key) != value]
    if changes:
        raise ConfigError(f"workdir {workdir} holds a fit with other settings ({'; '.join(changes[:4])}); "
                          "use a new --workdir, or the same arguments to continue it")
    steps = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()]
    return max(steps, default=0)


class FitRecorder:
    """`fit`'s after-step hook for the command: every `every` steps and at the last one,
    validate, append a line to sft_metrics.jsonl and checkpoint the weights with the optimiser's
    state (what a continued fit needs). The minutes recorded are the fit's own, validation and
    saving left out, summed over the sittings of a continued fit."""

    def __init__(self, exp, sft: SFTConfig, workdir: Path, every: int, log):
        from ragen_jax.run.checkpoint import Checkpoints
        from ragen_jax.training.validation import Validator

        self.exp, self.sft, self.workdir, self.every, self.log = exp, sft, workdir, every, log
        self.total = total_steps(sft)
        self.validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt,
                                   exp.run.settings.eval, exp.run.step.rollout)
        self.checkpoints = Checkpoints(workdir, keep=1)
        self.seconds, self.mark = 0.0, time.perf_counter()

    def resume(self, done: int):
        """`fit`'s `start` for a fit stopped after `done` steps (None for a new one); drops the
        metrics lines recorded after that checkpoint."""
        self.mark = time.perf_counter()
        path = self.workdir / METRICS
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        rows = [row for row in rows if row["step"] <= done]
        write_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))
        if done == 0:
            return None
        self.seconds = rows[-1]["fit_minutes"] * 60 if rows else 0.0
        params = nnx.state(self.exp.model)
        tx = optimizer(self.sft, self.total)
        opt = tx.init(params)
        if self.exp.mesh is not None:  # moments with their weights, step counts replicated: as a restore needs
            opt = jax.device_put(opt, sharding.optimizer_shardings(tx, params, self.exp.mesh))
        like = _fit_state(done, params, opt)
        state = self.checkpoints.restore(done, like)
        self.log(f"continuing the fit from step {done} of {self.total}")
        self.mark = time.perf_counter()
        return done, state.policy, state.policy_opt

    def __call__(self, step: int, params, opt, loss: float) -> None:
        if step != self.total and (self.every == 0 or step % self.every):
            return
        jax.block_until_ready(params)
        self.seconds += time.perf_counter() - self.mark
        metrics, traj = self.validator(params)
        metrics.update(validation_metrics(to_host(traj), self.exp.tokenizer, self.exp.env, self.exp.env_params))
        row = {"step": step, "fit_minutes": round(self.seconds / 60, 2), "loss": round(loss, 4),
               **{name: round(value, 4) for name, value in metrics.items()}}
        with open(self.workdir / METRICS, "a") as out:
            out.write(json.dumps(row) + "\n")
        right = metrics.get("reasoning/player_right")
        self.log(f"step {step}/{self.total} ({row['fit_minutes']:.1f} min): validation success "
                 f"{metrics['success']:.3f}, valid actions {metrics['valid_action_rate']:.3f}"
                 + ("" if right is None else f", player cell right {right:.3f}"))
        self.checkpoints.save(_fit_state(step, params, opt), force=True)
        self.mark = time.perf_counter()

    def close(self) -> None:
        self.checkpoints.close()


def _fit_state(step: int, params, opt):
    """The fit's weights and optimiser state as a checkpoint holds them (`train` reads the policy)."""
    from ragen_jax.training.step import TrainState

    return TrainState(step=jnp.int32(step), key=jax.random.key(0), policy=params, policy_opt=opt, critic=None,
                      critic_opt=None, reference=None, empty_streak=jnp.int32(0), diagnostics=None)


if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
