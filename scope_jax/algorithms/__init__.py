"""RL algorithm pieces as small pure functions: advantages, policy loss, KL, loss aggregation.

Per-token quantities are [B, L] float32 arrays; the loss mask is a float [B, L] array applied once, by an
aggregation mode. Pieces a config chooses by name live in registries (`ADVANTAGES`, `KL_ESTIMATORS`,
`AGGREGATIONS`); an unknown name raises KeyError listing the known ones.
"""

from scope_jax.algorithms.advantages import ADVANTAGES, GROUP_SIZE, dr_grpo, grpo, rloo
from scope_jax.algorithms.aggregation import (
    AGGREGATIONS,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    token_mean,
)
from scope_jax.algorithms.kl import KL_ESTIMATORS, k1, k2, k3
from scope_jax.algorithms.policy_loss import clipped_policy_loss
from scope_jax.algorithms.registry import Registry, register

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "GROUP_SIZE",
    "KL_ESTIMATORS",
    "Registry",
    "clipped_policy_loss",
    "dr_grpo",
    "grpo",
    "k1",
    "k2",
    "k3",
    "register",
    "rloo",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "token_mean",
]
