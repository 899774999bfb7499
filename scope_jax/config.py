"""Config validation: a run's config must have the keys and types of its experiment's defaults.

Every experiment declares `default_config()`; a config file starts from it and changes values. Anything
else (a misspelt key in a file or on the command line, a string where a number belongs) stops the run
before any work, with one line that names the key. A job's `check` states what its values must be as
data (`require` with `Rule`s: a count of at least 1, a finite rate, a fraction, a name from a list), so
that a nonsensical value is refused the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping

import ml_collections


class ConfigError(ValueError):
    """A config key is unknown, ill-typed, or in an impossible combination."""


def _compatible(value: Any, default: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (tuple, list)):
        # a tuple of the default's element type (an empty default says nothing about its elements)
        return isinstance(value, (tuple, list)) and (not default
                                                     or all(_compatible(v, default[0]) for v in value))
    return isinstance(value, type(default))


def _type_name(default: Any) -> str:
    if isinstance(default, (tuple, list)) and default:
        return f"{type(default).__name__} of {_type_name(default[0])}"
    return type(default).__name__


def validate(config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Raise ConfigError naming the first key of `config` that `schema` does not allow."""
    for key, value in config.items():
        name = prefix + key
        if key not in schema:
            raise ConfigError(f"unknown config key '{name}'")
        default = schema[key]
        if isinstance(default, ml_collections.ConfigDict):
            if not isinstance(value, ml_collections.ConfigDict):
                raise ConfigError(f"config key '{name}' must be a group of settings, got {value!r}")
            validate(value, default, name + ".")
        elif isinstance(value, ml_collections.ConfigDict) or not _compatible(value, default):
            raise ConfigError(f"config key '{name}' must be of type {_type_name(default)}, "
                              f"got {type(value).__name__} {value!r}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a config value must be: `holds(value)`, said as `what` ("at least 1")."""

    holds: Callable[[Any], bool]
    what: str


def at_least(bound: float) -> Rule:
    """A number >= bound (NaN never is)."""
    return Rule(lambda value: value >= bound, f"at least {bound}")


def one_of(names: Iterable[str]) -> Rule:
    names = tuple(names)
    return Rule(lambda value: value in names, f"one of {', '.join(map(repr, names))}")


FINITE = Rule(lambda value: math.isfinite(value), "finite")
FINITE_AT_LEAST_0 = Rule(lambda value: math.isfinite(value) and value >= 0, "finite and at least 0")
FINITE_POSITIVE = Rule(lambda value: math.isfinite(value) and value > 0, "finite and positive")
FRACTION = Rule(lambda value: 0 <= value < 1, "in [0, 1)")
PROBABILITY = Rule(lambda value: 0 < value <= 1, "in (0, 1]")


def require(config: ml_collections.ConfigDict, rules: Mapping[str, Rule]) -> None:
    """Raise ConfigError naming the first dotted key of `rules` whose value in `config` breaks its rule."""
    for key, rule in rules.items():
        value = config
        for part in key.split("."):
            value = value[part]
        if not rule.holds(value):
            raise ConfigError(f"config key '{key}' is {value!r}; it must be {rule.what}")
