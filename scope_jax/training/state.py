"""The joint agent-simulator training state: one pytree for both roles.

    params     {"agent": agent params, "sims": simulator params stacked on a leading population axis P}
               ("sims" is absent in self-play, where the simulator role reads params["agent"])
    ref_params the frozen reference for the KL term of each role whose coefficient is non-zero
               ({"agent": ..., "sims": ...}, or a subset; empty when no role uses a KL term)
    opt_state  one optax state over `params` (frozen parts get optax.set_to_zero: no state, no update)
    step       number of train steps taken (skipped non-finite steps included)
    rng        PRNG key the host loop splits for rollouts
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from scope_jax import sharding
from scope_jax.models.decoder import PARTITION_RULES, population_axes


@struct.dataclass
class JointState:
    params: dict[str, Any]
    ref_params: dict[str, Any]
    opt_state: optax.OptState
    step: jax.Array
    rng: jax.Array


def stack_population(members: list[Any]) -> Any:
    """P parameter trees of one architecture -> one tree with a leading population axis on the parts a
    population stacks (`decoder.population_axes`): every leaf of a plain tree; the adapters of LoRA
    members, over the base they share (ValueError if their bases differ)."""
    def stack(axis, *parts):
        if axis is not None:
            return jax.tree.map(lambda *leaves: jnp.stack(leaves), *parts)
        if not all(jax.tree.all(jax.tree.map(lambda a, b: a is b or bool(jnp.array_equal(a, b)), parts[0], p))
                   for p in parts[1:]):
            raise ValueError("the members of a population must share the parts it does not stack (a LoRA "
                             "population: one base)")
        return parts[0]

    return jax.tree.map(stack, population_axes(members[0]), *members, is_leaf=lambda a: a is None)


def leaves_at(tree: Any, i) -> Any:
    """Every leaf indexed at i (an int or a tuple of ints): member i of a `stack_population` tree."""
    return jax.tree.map(lambda x: x[i], tree)


def create(params: dict[str, Any], optimizer: optax.GradientTransformation, seed: int,
           ref_roles: tuple[str, ...] = ()) -> JointState:
    """Initial state; `ref_roles` names the roles ("agent", "sims") that keep a frozen KL reference."""
    ref = {role: jax.tree.map(jnp.copy, params[role]) for role in ref_roles if role in params}
    return JointState(params=params, ref_params=ref, opt_state=optimizer.init(params),
                      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(seed)))


def joint_rules(rules: sharding.Rules = PARTITION_RULES) -> tuple[tuple[str, Any], ...]:
    """Partition rules for a JointState: simulator leaves carry the population axis first (unsharded),
    except the base of a LoRA population (`LoRAParams.base`), which all members share."""
    shared_base = tuple((r"(^|/)sims/base/.*" + pattern.lstrip("^"), spec) for pattern, spec in rules)
    population = tuple((r"(^|/)sims/.*" + pattern.lstrip("^"), jax.sharding.PartitionSpec(None, *spec))
                       for pattern, spec in rules)
    return shared_base + population + tuple(rules)


def state_shardings(state: JointState, mesh: jax.sharding.Mesh, rules: sharding.Rules = PARTITION_RULES):
    """NamedShardings for every leaf of `state` (abstract or concrete): parameters and their optimizer
    moments by the partition rules, scalars replicated."""
    return sharding.named_shardings(state, joint_rules(rules), mesh)
