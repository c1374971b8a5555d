"""Environments by name: `make("SimpleSokoban", max_steps=50) -> (env, params)`."""

from __future__ import annotations

import dataclasses

from ragen_jax.envs.base import Environment
from ragen_jax.envs.countdown import COUNTDOWN, CountdownParams
from ragen_jax.envs.frozenlake import FROZENLAKE, FrozenLakeParams
from ragen_jax.envs.sokoban import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SOKOBAN

PRESETS: dict[str, tuple[Environment, object]] = {
    "SimpleSokoban": (SOKOBAN, SIMPLE_SOKOBAN),
    "LargerSokoban": (SOKOBAN, LARGER_SOKOBAN),
    "FrozenLake": (FROZENLAKE, FrozenLakeParams()),
    "Countdown": (COUNTDOWN, CountdownParams()),
}
ALIASES = {"sokoban": "SimpleSokoban", "frozenlake": "FrozenLake", "countdown": "Countdown"}


def names() -> list[str]:
    return sorted(PRESETS) + sorted(ALIASES)


def make(name: str, **overrides) -> tuple[Environment, object]:
    """The environment and its parameters, with any parameter overridden by keyword."""
    preset = ALIASES.get(name, name)
    if preset not in PRESETS:
        raise ValueError(f"unknown environment {name!r}; allowed: {', '.join(names())}")
    env, params = PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for {preset}; allowed: {', '.join(sorted(fields))}")
    return env, params.replace(**overrides)
