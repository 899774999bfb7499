"""Jobs the runner dispatches to, one module each, named by a config's `experiment` field.

A job module defines:
  default_config() -> ml_collections.ConfigDict   every key the job reads, with its default value
  run(config, run_dir) -> None                    the work; writes into run_dir (scope_jax RunDir)
and may define check(config), raising scope_jax.config.ConfigError for impossible combinations and
returning what it built while checking, if anything (dialogue_rl: the simulator mode and the environment),
which the runner hands on as run(config, run_dir, checked) so that nothing is built twice, and
schema(config), the keys and types this config may have where they depend on it (default: default_config(),
e.g. dialogue_rl's env group is its environment's: training.config.env_settings).
"""

import importlib
import pkgutil
from types import ModuleType

from scope_jax.config import ConfigError


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__))


def load(name: str) -> ModuleType:
    if name not in available():
        raise ConfigError(f"config key 'experiment' is {name!r}; known experiments: {', '.join(available())}")
    return importlib.import_module(f"{__name__}.{name}")
