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
from scope_jax.models.decoder import PARTITION_RULES


@struct.dataclass
class JointState:
    params: dict[str, Any]
    ref_params: dict[str, Any]
    opt_state: optax.OptState
    step: jax.Array
    rng: jax.Array


def stack_population(members: list[Any]) -> Any:
    """P parameter trees of one architecture -> one tree with a leading population axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *members)


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
