"""Per-token estimators of KL(pi_theta || pi_ref) to a frozen reference, for the loss's KL term.

Direction: the *reverse* KL from the policy to the reference, estimated from tokens sampled from pi_theta
(in practice the behaviour policy that generated the batch, close to pi_theta). With the per-token log-ratio
d = logp - logp_ref, where logp = log pi_theta(x_t) and logp_ref = log pi_ref(x_t) of the sampled token:

    k1 = d                                unbiased, can be negative, high variance
    k2 = d^2 / 2                          >= 0, biased, low variance
    k3 = exp(-d) - (-d) - 1               >= 0, unbiased, low variance (Schulman, "Approximating KL")

Every estimator is `fn(logp [B, L], logp_ref [B, L]) -> [B, L]` float32, registered in `KL_ESTIMATORS`.

As a loss term (`scope_jax.training.loss`), the per-token estimate is aggregated with the loss mask and
beta times it is added; gradients then flow through logp. Which divergence that gradient follows differs
from the value estimated: on-policy, E[grad k1] = 0, E[grad k2] = grad KL(pi_theta || pi_ref), and
E[grad k3] = grad KL(pi_ref || pi_theta).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from scope_jax.algorithms.registry import Registry, register

KL_ESTIMATORS = Registry("KL estimator")


def _log_ratio(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, logp_ref])
    return logp.astype(jnp.float32) - logp_ref.astype(jnp.float32)


@register(KL_ESTIMATORS, "k1")
def k1(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k1 = logp - logp_ref = log(pi_theta / pi_ref); E_{x~pi_theta}[k1] = KL(pi_theta || pi_ref)."""
    return _log_ratio(logp, logp_ref)


@register(KL_ESTIMATORS, "k2")
def k2(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k2 = (logp - logp_ref)^2 / 2; >= 0, biased (exact to second order when pi_theta is near pi_ref)."""
    return 0.5 * _log_ratio(logp, logp_ref) ** 2


@register(KL_ESTIMATORS, "k3")
def k3(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1; >= 0, E_{x~pi_theta}[k3] = KL(pi_theta || pi_ref).

    Unbiased because E_{x~pi_theta}[pi_ref / pi_theta - 1] = 0: k3 is k1 plus a zero-mean control variate.
    Computed as expm1(u) - u with u = logp_ref - logp, which keeps its small values accurate.
    """
    u = -_log_ratio(logp, logp_ref)
    return jnp.expm1(u) - u
