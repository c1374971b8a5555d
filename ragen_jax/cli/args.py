"""What the commands share: `--config FILE --workdir DIR` with free-form `--config.a.b=value`
overrides (and the jax.distributed flags where a command runs on several processes)."""

from __future__ import annotations

import argparse

from ragen_jax.run import config as config_lib
from ragen_jax.core import distributed


def parse_args(argv, description: str, workdir_required: bool = True, multi_process: bool = False):
    """argparse for --config/--workdir plus free-form `--config.a.b=value` overrides (and the
    jax.distributed flags with `multi_process`)."""
    parser = argparse.ArgumentParser(description=description, epilog=(
        "Any config key can be overridden after --config, e.g. --config.seed=1 --config.algo.name=grpo "
        "--config.rollout.temperature=0.7; an optional key is unset with None, e.g. --config.env.max_steps=None "
        "(every key, its default and its checks: ragen_jax/run/schema.py)."))
    if multi_process:
        distributed.add_arguments(parser)
    parser.add_argument("--config", required=True, help="a config file with get_config(), e.g. configs/sokoban_tiny.py")
    parser.add_argument("--workdir", required=workdir_required,
                        help="where metrics and checkpoints go" + ("" if workdir_required else
                                                                   " (default: runs/<config name>)"))
    args, rest = parser.parse_known_args(argv)
    return args, config_lib.split_overrides(rest, parser.error)


def load_config(path: str, overrides: dict):
    return config_lib.apply_overrides(config_lib.load_config_file(path), overrides)
