"""Proposition 3.4 (our formalization): KL-regularised mirror descent concentrates on the shortcut set.

One-turn setting (a contextual bandit; every function acts along the last, action, axis): action values
Q(a) = sum_u phi(u | x, a) R(x, a, u). The shortcut set A_x holds the near-optimal actions against the mode
user, A_x = {a : Q_mode(a) >= max_b Q_mode(b) - tolerance}, with gap
Delta_x = min_{a in A_x} Q_mode(a) - max_{b not in A_x} Q_mode(b) > 0.

The KL-regularised natural-gradient / mirror-descent step, started at pi_0 = pi_ref,

    pi_{t+1}(a)  proportional to  pi_t(a)^(1 - eta beta) pi_ref(a)^(eta beta) exp(eta Q(a)),

has the closed form log pi_t(a)/pi_t(b) = log pi_ref(a)/pi_ref(b) + s_t (Q(a) - Q(b)) with
s_t = (1 - (1 - eta beta)^t) / beta (eta t when beta = 0). Training against the mode user (Q = Q_mode), every
a in A_x gains at least s_t Delta_x of log-odds over every b outside. Against the true simulator,
|Q_phi(a) - Q_mode(a)| <= eps(x, a) dr, so the gain is at least s_t (Delta_x - 2 eps*_x dr) with
eps*_x = max_a eps(x, a); that is a concentration statement when Delta_x > 2 eps*_x dr.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def strength(t: jax.Array, eta: float, beta: float) -> jax.Array:
    """s_t = (1 - (1 - eta beta)^t) / beta, or eta t when beta = 0."""
    if beta == 0:
        return eta * t
    return (1.0 - (1.0 - eta * beta) ** t) / beta


def mirror_descent(log_pi0: jax.Array, log_ref: jax.Array, q: jax.Array, eta: float, beta: float,
                   steps: int) -> jax.Array:
    """[steps + 1, ..., A]: log pi_t for t = 0..steps, iterating the update above (in log space)."""

    def step(log_pi, _):
        new = jax.nn.log_softmax((1.0 - eta * beta) * log_pi + eta * beta * log_ref + eta * q, axis=-1)
        return new, new

    _, path = jax.lax.scan(step, log_pi0, None, length=steps)
    return jnp.concatenate([log_pi0[None], path])


def closed_form(log_ref: jax.Array, q: jax.Array, s: jax.Array) -> jax.Array:
    """log pi_t = log softmax(log pi_ref + s_t Q), for s of shape [S]: result [S, ..., A]."""
    return jax.nn.log_softmax(log_ref + s.reshape(s.shape + (1,) * q.ndim) * q, axis=-1)


class PolicyGradientPath(NamedTuple):
    log_odds: jax.Array  # [steps + 1, ...]: log pi_t(A_x) / pi_t(not A_x)
    certified: jax.Array  # [steps, ...]: step t meets the increase certificate (see softmax_pg)


def softmax_pg(logits0: jax.Array, q: jax.Array, mask: jax.Array, eta: float,
               steps: int) -> PolicyGradientPath:
    """Plain softmax policy gradient with exact gradients, theta_{t+1} = theta_t + eta pi_t (Q - J_t).

    Certificate: if A_x leaves some action out, J_t > max_{b not in A_x} Q(b) and
    sum_{a in A_x} pi_t(a)^2 (Q(a) - J_t) >= 0, then the step raises the log-odds of A_x. The change is
    log E_{pi|A}[e^g] - log E_{pi|not A}[e^g] with g = eta pi (Q - J): the first term is
    >= eta E_{pi|A}[pi (Q - J)] >= 0 by Jensen, the second < 0 as every g_b < 0. When A_x holds argmax Q,
    PG converges to it (Mei et al., 2020), so both conditions hold from some step on.
    """
    outside_best = jnp.max(jnp.where(mask, -jnp.inf, q), axis=-1)

    def step(theta, _):
        pi = jax.nn.softmax(theta, axis=-1)
        j = jnp.sum(pi * q, axis=-1, keepdims=True)
        certified = (jnp.any(~mask, axis=-1) & (j[..., 0] > outside_best)
                     & (jnp.sum(jnp.where(mask, pi**2 * (q - j), 0.0), axis=-1) >= 0))
        new = theta + eta * pi * (q - j)
        return new, (set_log_odds(jax.nn.log_softmax(new, axis=-1), mask), certified)

    _, (log_odds, certified) = jax.lax.scan(step, logits0, None, length=steps)
    start = set_log_odds(jax.nn.log_softmax(logits0, axis=-1), mask)
    return PolicyGradientPath(jnp.concatenate([start[None], log_odds]), certified)


def shortcut_set(q_mode: jax.Array, tolerance: float) -> jax.Array:
    """Boolean mask of A_x = {a : Q_mode(a) >= max_b Q_mode(b) - tolerance}."""
    return q_mode >= jnp.max(q_mode, axis=-1, keepdims=True) - tolerance


def separation(values: jax.Array, mask: jax.Array) -> jax.Array:
    """min_{a in mask} values(a) - max_{b not in mask} values(b).

    On Q_mode this is the gap Delta_x; on log pi_t - log pi_ref it is the smallest log-odds gain of a shortcut
    action over a non-shortcut one.
    """
    return (jnp.min(jnp.where(mask, values, jnp.inf), axis=-1)
            - jnp.max(jnp.where(mask, -jnp.inf, values), axis=-1))


def positive_gap(gap: jax.Array) -> jax.Array:
    """The hypothesis of the log-odds bound: A_x leaves some action out (finite gap) and the gap is > 0."""
    return jnp.isfinite(gap) & (gap > 0)


def set_log_odds(log_pi: jax.Array, mask: jax.Array) -> jax.Array:
    """log pi(A_x) - log pi(not A_x)."""
    inside = jax.nn.logsumexp(jnp.where(mask, log_pi, -jnp.inf), axis=-1)
    outside = jax.nn.logsumexp(jnp.where(mask, -jnp.inf, log_pi), axis=-1)
    return inside - outside
