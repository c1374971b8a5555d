"""Environments by name: `make("SimpleSokoban", max_steps=50) -> (env, params)`.

Presets are an env with default parameters (keyword overrides replace parameter fields);
factories build the env itself from their keywords (the QA task loads its dataset).
"""

from __future__ import annotations

import dataclasses
import inspect

from ragen_jax.envs.base import Environment
from ragen_jax.envs.countdown import COUNTDOWN, CountdownParams
from ragen_jax.envs.frozenlake import FROZENLAKE, FrozenLakeParams
from ragen_jax.envs.qa import make_qa
from ragen_jax.envs.sokoban import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SOKOBAN

PRESETS: dict[str, tuple[Environment, object]] = {
    "SimpleSokoban": (SOKOBAN, SIMPLE_SOKOBAN),
    "LargerSokoban": (SOKOBAN, LARGER_SOKOBAN),
    "FrozenLake": (FROZENLAKE, FrozenLakeParams()),
    "Countdown": (COUNTDOWN, CountdownParams()),
}
FACTORIES = {"MathQA": make_qa}
ALIASES = {"sokoban": "SimpleSokoban", "frozenlake": "FrozenLake", "countdown": "Countdown", "mathqa": "MathQA"}


def names() -> list[str]:
    return sorted([*PRESETS, *FACTORIES]) + sorted(ALIASES)


def make(name: str, **overrides) -> tuple[Environment, object]:
    """The environment and its parameters, with any parameter overridden by keyword."""
    preset = ALIASES.get(name, name)
    if preset not in PRESETS:
        if preset not in FACTORIES:
            raise ValueError(f"unknown environment {name!r}; allowed: {', '.join(names())}")
        allowed = sorted(inspect.signature(FACTORIES[preset]).parameters)
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]!r} for {preset}; allowed: {', '.join(allowed)}")
        return FACTORIES[preset](**overrides)
    env, params = PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for {preset}; allowed: {', '.join(sorted(fields))}")
    return env, params.replace(**overrides)
