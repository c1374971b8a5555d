"""Environments by name: `make("SimpleSokoban", max_steps=50) -> (env, params)`.

Each name is an `Entry`: a preset (an env with default parameters; keyword overrides replace
parameter fields) or a factory (it builds the env from its keywords: the QA task loads its
dataset), with the run-config keys it takes (`options`: `env.<key>`, checked by the run
config's `EnvSection`). `register` adds a game, e.g. a new one or a test's toy.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ragen_jax.envs.base import Environment
from ragen_jax.envs.countdown import COUNTDOWN, CountdownParams
from ragen_jax.envs.frozenlake import FROZENLAKE, FrozenLakeParams
from ragen_jax.envs.qa import make_qa
from ragen_jax.envs.sokoban import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SOKOBAN
from ragen_jax.envs.coordinates import RENDER_FORMATS


@dataclasses.dataclass(frozen=True)
class Option:
    """A run-config key `env.<key>` an env takes. A value other than None goes to `make` as the
    keyword `argument` (None: the key itself), converted by `kind` (None: as it is); `bounds`
    are the allowed values, both ends included (None: any); `unset` says what None means, for
    the error line."""

    argument: str | None = None
    kind: Callable[[Any], Any] | None = None
    bounds: tuple[float, float] | None = None
    unset: str = "the preset's"
    choices: tuple[str, ...] | None = None  # the allowed values (None: any)

    def check(self, key: str, value: Any) -> None:
        if value is not None and self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            low, high = self.bounds
            raise ValueError(f"env.{key}={value} must be in [{low:g}, {high:g}] (or None for {self.unset})")
        if value is not None and self.choices is not None and value not in self.choices:
            raise ValueError(f"env.{key}={value!r} is not one of {', '.join(self.choices)} (or None for {self.unset})")

    def keyword(self, key: str, value: Any) -> dict:
        """`make`'s keyword argument for the key's value: none when it is unset (None)."""
        return {} if value is None else {self.argument or key: value if self.kind is None else self.kind(value)}


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered env: a preset (`env` with `params`) or a `factory` returning (env, params)
    from its keywords; and the run-config keys it takes (`options`, by key)."""

    env: Environment | None = None
    params: Any = None
    factory: Callable[..., tuple[Environment, Any]] | None = None
    options: Mapping[str, Option] = dataclasses.field(default_factory=dict)

    def keywords(self) -> list[str]:
        """The keywords `make` accepts for this entry."""
        if self.factory is not None:
            return sorted(inspect.signature(self.factory).parameters)
        return sorted(f.name for f in dataclasses.fields(self.params))


MAX_STEPS = {"max_steps": Option()}
BOARD = {**MAX_STEPS, "render_format": Option(choices=RENDER_FORMATS, unset="the preset's grid")}
ENVS: dict[str, Entry] = {
    "SimpleSokoban": Entry(SOKOBAN, SIMPLE_SOKOBAN, options=BOARD),
    "LargerSokoban": Entry(SOKOBAN, LARGER_SOKOBAN, options=BOARD),
    "FrozenLake": Entry(FROZENLAKE, FrozenLakeParams(), options={
        **BOARD, "success_rate": Option(kind=float, bounds=(0.0, 1.0), unset="the preset's 1/3")}),
    "Countdown": Entry(COUNTDOWN, CountdownParams(), options=MAX_STEPS),
    "MathQA": Entry(factory=make_qa, options={"data_path": Option(), "data_dir": Option(), "num_records": Option(),
                                              "data_seed": Option(argument="seed"), "max_attempts": Option()}),
}
ALIASES = {"sokoban": "SimpleSokoban", "frozenlake": "FrozenLake", "countdown": "Countdown", "mathqa": "MathQA"}


def register(name: str, entry: Entry, aliases: tuple[str, ...] = ()) -> None:
    """Add an env under `name` (and `aliases`); its options' arguments must be `make`'s keywords."""
    taken = [n for n in (name, *aliases) if n in ENVS or n in ALIASES]
    if taken:
        raise ValueError(f"environment name {taken[0]!r} is taken")
    if (entry.env is None) == (entry.factory is None):
        raise ValueError(f"environment {name!r}: give either a preset env (with params) or a factory")
    allowed = entry.keywords()
    for key, option in entry.options.items():
        if (option.argument or key) not in allowed:
            raise ValueError(f"environment {name!r}: option {key!r} names {option.argument or key!r}, not a "
                             f"keyword of make; allowed: {', '.join(allowed)}")
    ENVS[name] = entry
    ALIASES.update(dict.fromkeys(aliases, name))


def names() -> list[str]:
    return sorted(ENVS) + sorted(ALIASES)


def entry(name: str) -> Entry:
    """The entry of a name or alias."""
    if ALIASES.get(name, name) not in ENVS:
        raise ValueError(f"unknown environment {name!r}; allowed: {', '.join(names())}")
    return ENVS[ALIASES.get(name, name)]


def users(key: str) -> list[str]:
    """The envs (their names, not aliases) that take the run-config key `env.<key>`."""
    return [name for name in sorted(ENVS) if key in ENVS[name].options]


def make(name: str, **overrides) -> tuple[Environment, object]:
    """The environment and its parameters, with any parameter overridden by keyword."""
    found, preset = entry(name), ALIASES.get(name, name)
    allowed = found.keywords()
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for {preset}; allowed: {', '.join(allowed)}")
    if found.factory is not None:
        return found.factory(**overrides)
    return found.env, found.params.replace(**overrides)
