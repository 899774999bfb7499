"""Corollary 3.5 (our formalization): geometric concentration on A_x and the entropy collapse it forces.

Under the mirror-descent iterates of Proposition 3.4 with a gap D > 0 between A_x and its complement
(D = Delta_x against the mode user, D = Delta_x - 2 eps*_x dr against the true simulator):

    1 - pi_t(A_x)  <=  pi_t(not A_x) / pi_t(A_x)  <=  [pi_ref(not A_x) / pi_ref(A_x)] exp(-D s_t) = dbar_t.

Grouping the entropy by A_x, H(pi) = h(d) + (1 - d) H(pi | A_x) + d H(pi | not A_x) with d = 1 - pi(A_x) and
h the binary entropy, so H(pi) <= f(d) := h(d) + (1 - d) log|A_x| + d log|not A_x|. f is increasing up to
d* = |not A_x| / |A| (where f = log|A|), hence H(pi_t) <= f(min(dbar_t, d*)); with |A_x| = 1 this tends to 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy


def outside_mass(log_pi: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - pi(A_x)."""
    return jnp.exp(jax.nn.logsumexp(jnp.where(mask, -jnp.inf, log_pi), axis=-1))


def outside_mass_bound(log_ref: jax.Array, mask: jax.Array, gap: jax.Array, s: jax.Array) -> jax.Array:
    """dbar = [pi_ref(not A_x) / pi_ref(A_x)] exp(-gap s), for log_ref [..., A] and s broadcast on [...]."""
    inside = jax.nn.logsumexp(jnp.where(mask, log_ref, -jnp.inf), axis=-1)
    outside = jax.nn.logsumexp(jnp.where(mask, -jnp.inf, log_ref), axis=-1)
    return jnp.exp(outside - inside - gap * s)


def entropy(log_pi: jax.Array) -> jax.Array:
    """H(pi) = -sum_a pi(a) log pi(a), in nats."""
    return -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)


def entropy_bound(dbar: jax.Array, mask: jax.Array) -> jax.Array:
    """f(min(dbar, d*)) with f(d) = h(d) + (1 - d) log|A_x| + d log|not A_x| and d* = |not A_x| / |A|."""
    n_in = jnp.sum(mask, axis=-1)
    n_out = mask.shape[-1] - n_in
    d = jnp.minimum(dbar, n_out / mask.shape[-1])
    binary = -xlogy(d, d) - xlogy(1.0 - d, 1.0 - d)
    return binary + xlogy(1.0 - d, n_in) + xlogy(d, n_out)
