"""Environments: task sources, what each role is told, turn handling and rewards (the interface they
implement: scope_jax/dialogue/environment.py).

`make(name, **settings)` builds one by name; each environment module registers its class in ENVIRONMENTS.
"""

from scope_jax.dialogue.environment import Environment
from scope_jax.envs.cooperbench import CooperBenchEnv
from scope_jax.envs.p4g import P4GEnv
from scope_jax.envs.target_word import TargetWordEnv
from scope_jax.envs.tau2 import Tau2Env

ENVIRONMENTS = {"target_word": TargetWordEnv, "p4g": P4GEnv, "tau2": Tau2Env, "cooperbench": CooperBenchEnv}


def make(name: str, **settings) -> Environment:
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVIRONMENTS))}")
    return ENVIRONMENTS[name](**settings)


__all__ = ["ENVIRONMENTS", "make"]
