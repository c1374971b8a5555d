"""`python -m ragen_jax.sft --config configs/sokoban_tiny.py --workdir DIR [--episodes N] [--epochs E] [--batch-size B] [--lr LR] [--init W] [--name-holes] [--export HF_DIR]`

Supervised warm start from solver demonstrations (`ragen_jax.training.sft` says how), saved as
a checkpoint that `train` can start from (`--config.model.init=DIR`). The fit shows `train`'s
progress bar on stderr (steps, loss, time left; off with `--config.logging.progress=false`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core import compile_cache, quiet
from ragen_jax.core.files import check_writable_dir, describe, write_atomically
from ragen_jax.training.sft import SFTConfig, check_env, warm_start


def main(argv=None) -> int:
    quiet.commands()
    from ragen_jax.cli.args import load_config, parse_args
    from ragen_jax.run.checkpoint import CheckpointError, Checkpoints
    from ragen_jax.run.config import to_json
    from ragen_jax.core.errors import ConfigError
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.step import TrainState
    from ragen_jax.training.validation import Validator

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--episodes", type=int, default=SFTConfig.episodes)
    parser.add_argument("--epochs", type=int, default=SFTConfig.epochs)
    parser.add_argument("--lr", type=float, default=SFTConfig.lr)
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size, help="episodes per Adam step")
    parser.add_argument("--noise", type=float, default=SFTConfig.noise)
    parser.add_argument("--name-holes", action="store_true", help="FrozenLake: the reasoning also names the "
                        "moves that would step into a hole (docs/tuning.md, naming the holes)")
    parser.add_argument("--init", default=None, help="continue from these weights (a workdir, a Hugging Face "
                        "directory or builtin:<name>) instead of random ones")
    parser.add_argument("--export", default="", help="also write a Hugging Face directory here")
    extra, rest = parser.parse_known_args(argv)
    args, overrides = parse_args(rest, "Supervised warm start from solver demonstrations.")
    workdir = Path(args.workdir)
    try:
        config = load_config(args.config, overrides)
        with config.unlocked():
            config.model.init = extra.init  # the configs' own warm start is not where a fit begins
        exp = make_experiment(config)
        # `--config.seed` picks the demonstrations' levels and noise and the minibatch order
        sft = SFTConfig(episodes=extra.episodes, epochs=extra.epochs, batch_size=extra.batch_size, lr=extra.lr,
                        noise=extra.noise, name_holes=extra.name_holes, seed=exp.run.settings.seed)
        check_env(exp.env, sft)  # a solver, and holes to name if asked
        check_writable_dir(workdir, "--workdir")
        if (workdir / "checkpoints").is_dir() and any((workdir / "checkpoints").iterdir()):
            raise ConfigError(f"workdir {workdir} already has checkpoints; use a new --workdir")
    except (ConfigError, CheckpointError, ValueError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    compile_cache.enable()
    log = lambda message: print(message, file=sys.stderr)
    warm_start(exp, sft, log, progress=exp.run.settings.logging.progress)  # train's bar, and its switch
    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, exp.run.settings.eval,
                          exp.run.step.rollout)
    metrics, _ = validator(nnx.state(exp.model))
    log(f"validation after SFT: success {metrics['success']:.3f}, valid actions {metrics['valid_action_rate']:.3f}")
    state = TrainState(step=jnp.int32(0), key=jax.random.key(0), policy=nnx.state(exp.model), policy_opt=None,
                       critic=None, critic_opt=None, reference=None, empty_streak=jnp.int32(0), diagnostics=None)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        write_atomically(workdir / "config.json", to_json(exp.run.values))
        checkpoints = Checkpoints(workdir, keep=1)
        try:
            checkpoints.save(state, force=True)
        finally:
            checkpoints.close()
        if extra.export:
            from ragen_jax.models import hf

            hf.save_pretrained(exp.model, extra.export, tokenizer=exp.tokenizer)
    except OSError as err:  # a full disk (CheckpointWriteError is one too)
        print(f"error: {describe(err)}", file=sys.stderr)
        return 1
    log(f"wrote {workdir}/checkpoints/0" + (f" and {extra.export}" if extra.export else ""))
    return 0

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
