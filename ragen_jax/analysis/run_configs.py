"""The configs the study and the benchmark scripts run, loaded with command-line overrides.

`run_config` loads an env's config by name (the repository's configs/: the study and the
benchmarks run from a checkout); `config_command` and `command_config` give a benchmark that
times one config its `--config`, `--steps` and `--set KEY=VALUE` flags. Loading a config
imports jax, so `ragen_jax.run.config` is imported inside the functions: a command's `--help`
and bad flags answer at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = {"sokoban": CONFIG_DIR / "sokoban_tiny.py", "frozenlake": CONFIG_DIR / "frozenlake_tiny.py",
           "frozenlake_paper": CONFIG_DIR / "frozenlake_paper_slip.py"}


def run_config(env: str, seed: int, overrides: dict[str, str]):
    """`env`'s config for one run with `seed`: no progress bar or TensorBoard, then `overrides`."""
    from ragen_jax.run import config as config_lib

    config = config_lib.load_config_file(str(CONFIGS[env]))
    return config_lib.apply_overrides(config, {"seed": str(seed), "logging.progress": "false",
                                               "logging.tensorboard": "false", **overrides})


def set_overrides(items: list[str], error) -> dict[str, str]:
    """The `--set KEY=VALUE` items of a benchmark command -> {KEY: VALUE}; an item without "="
    goes to `error` (an argparse parser's: one line, exit 2)."""
    for item in items:
        if "=" not in item:
            error(f"--set {item!r}: expected KEY=VALUE")
    return dict(item.split("=", 1) for item in items)


def config_command(description: str, steps: int) -> argparse.ArgumentParser:
    """A parser for benchmarks that time one config: `--config`, `--steps` (timed steps after
    the first, default `steps`) and `--set KEY=VALUE` overrides."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=str(CONFIGS["sokoban"]))
    parser.add_argument("--steps", type=int, default=steps, help=f"timed steps after the first (default {steps})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser


def command_config(parser: argparse.ArgumentParser, args, extra: dict[str, str] | None = None):
    """The config of a `config_command`'s arguments (plus `extra` overrides); a bad value ends the
    command with one line (exit 2)."""
    from ragen_jax.run import config as config_lib

    if args.steps < 1:
        parser.error(f"--steps={args.steps} must be >= 1")
    overrides = {**set_overrides(args.set, parser.error), **(extra or {})}
    try:
        return config_lib.apply_overrides(config_lib.load_config_file(args.config), overrides)
    except (config_lib.ConfigError, ValueError) as err:
        parser.error(str(err).splitlines()[0])
