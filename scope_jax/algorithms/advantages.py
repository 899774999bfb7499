"""Group-relative advantage estimators: the rollouts that share a scenario form a group.

Every estimator is `fn(rewards, group_ids, num_groups) -> advantages`, with rewards [N] float, group ids
[N] int and advantages [N] float32. Rollouts with the same id form one group G; groups may differ in size
and ids need not be contiguous, but every id must lie in [0, num_groups). `num_groups` fixes the shape of
the per-group segment sums, so it is static under `jax.jit` (any upper bound, such as N, works).

A group of one rollout, and a group whose rewards are all equal, gets advantage exactly 0.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from scope_jax.algorithms.registry import Registry, register
from scope_jax.config import at_least

ADVANTAGES = Registry("advantage estimator")
# the config rule for a group's size: every estimator here is group-relative
GROUP_SIZE = dataclasses.replace(at_least(2), what="at least 2: a group of one rollout gets advantage 0 from "
                                 "every (group-relative) advantage estimator")


def _group_sum(values: jax.Array, group_ids: jax.Array, num_groups: int) -> jax.Array:
    """[N] -> [N]: each rollout gets the sum of `values` over its group."""
    return jax.ops.segment_sum(values, group_ids, num_segments=num_groups)[group_ids]


def _deviation_and_size(
    rewards: jax.Array, group_ids: jax.Array, num_groups: int
) -> tuple[jax.Array, jax.Array]:
    """r_i - mean_{g(i)} and |g(i)|, both [N] float32."""
    chex.assert_rank(rewards, 1)
    chex.assert_shape(group_ids, rewards.shape)
    chex.assert_type(group_ids, int)
    rewards = rewards.astype(jnp.float32)
    size = _group_sum(jnp.ones_like(rewards), group_ids, num_groups)
    # Deviations are taken from rewards shifted by the group minimum: a constant group then gives exactly 0,
    # where a float group mean can be an ulp off, and grpo would blow that ulp up by 1/eps.
    group_min = jax.ops.segment_min(rewards, group_ids, num_segments=num_groups)[group_ids]
    shifted = rewards - group_min
    return shifted - _group_sum(shifted, group_ids, num_groups) / size, size


@register(ADVANTAGES, "grpo")
def grpo(rewards: jax.Array, group_ids: jax.Array, num_groups: int, eps: float = 1e-6) -> jax.Array:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + eps).

    std_g is the *sample* standard deviation, sqrt(sum_{j in g} (r_j - mean_g)^2 / (|g| - 1)), the
    convention of the common GRPO implementations (TRL, verl: `torch.std`, Bessel-corrected). So the
    advantages of a group have sample std 1 (up to eps); with rewards [1, 0, 0, 1], std_g = sqrt(1/3) and
    A = +-0.5 / (sqrt(1/3) + eps) = +-0.866.
    """
    deviation, size = _deviation_and_size(rewards, group_ids, num_groups)
    variance = _group_sum(deviation**2, group_ids, num_groups) / jnp.maximum(size - 1.0, 1.0)
    return deviation / (jnp.sqrt(variance) + eps)


@register(ADVANTAGES, "dr_grpo")
def dr_grpo(rewards: jax.Array, group_ids: jax.Array, num_groups: int) -> jax.Array:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i - mean_g, without dividing by the group std."""
    deviation, _ = _deviation_and_size(rewards, group_ids, num_groups)
    return deviation


@register(ADVANTAGES, "rloo")
def rloo(rewards: jax.Array, group_ids: jax.Array, num_groups: int) -> jax.Array:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): A_i = r_i - mean_{j in g, j != i} r_j.

    Equivalently A_i = |g| / (|g| - 1) * (r_i - mean_g); a group of one has no other rollout and gets 0.
    """
    deviation, size = _deviation_and_size(rewards, group_ids, num_groups)
    return deviation * size / jnp.maximum(size - 1.0, 1.0)
