"""Proposition 3.6 (our formalization): concentrating on the shortcut set costs regret on deployment users.

One turn, context x. V(a) is action a's value for the deployment users, V* = max_a V(a). If pi puts 1 - alpha
on A_x, then with Gamma_x = V* - max_{a in A_x} V(a) and Gamma'_x = V* - min_{a in A_x} V(a),

    (1 - alpha) Gamma_x  <=  regret(pi) = V* - E_pi V  <=  (1 - alpha) Gamma'_x + alpha dr;

the two bounds match as alpha -> 0 when the shortcut actions are worth the same to deployment users
(Gamma'_x = Gamma_x, e.g. |A_x| = 1).

The shortcut-vs-robust toy: a shortcut action pays 1 only if the user complies, a robust action pays c to
everyone. Training drives pi towards the action with the larger training value, P_train(comply) versus c.
Since P_train(comply) <= max_u phi(u) = 1 - eps, any training simulator with eps > 1 - c makes the robust
action preferred. Two ways to raise eps: Verbalized Sampling (sample from the simulator's stated distribution,
eps = 1 - p_max) and a population of K simulators with pairwise different modes, whose mixture has
eps >= 1 - 1/K - mean_k eps_k.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from theory import concentration, toy

COMPLY = 0  # the toy's reply index of compliance; the other replies refuse or stall
ROBUST = 1  # the toy's robust action; action 0 is the shortcut


class Regret(NamedTuple):
    regret: jax.Array
    lower: jax.Array
    upper: jax.Array


def regret_bounds(pi: jax.Array, v_dep: jax.Array, mask: jax.Array, dr: float) -> Regret:
    """Regret of pi against deployment values v_dep, with the bounds above (A_x given by mask)."""
    best = jnp.max(v_dep, axis=-1)
    on_set = jnp.sum(jnp.where(mask, pi, 0.0), axis=-1)  # 1 - alpha
    gamma = best - jnp.max(jnp.where(mask, v_dep, -jnp.inf), axis=-1)
    gamma_worst = best - jnp.min(jnp.where(mask, v_dep, jnp.inf), axis=-1)
    regret = best - jnp.sum(pi * v_dep, axis=-1)
    return Regret(regret, on_set * gamma, on_set * gamma_worst + (1.0 - on_set) * dr)


def toy_values(reply_probs: jax.Array, robust_payoff: float) -> jax.Array:
    """[..., 2]: values of (shortcut, robust) for users answering with reply_probs [..., U]."""
    comply = reply_probs[..., COMPLY]
    return jnp.stack([comply, jnp.full_like(comply, robust_payoff)], axis=-1)


def verbalized(p_max: jax.Array, replies: int) -> jax.Array:
    """[..., U]: a stated distribution with p_max on compliance, the rest spread evenly (eps = 1 - p_max)."""
    p_max = jnp.asarray(p_max)[..., None]
    return jnp.where(jnp.arange(replies) == COMPLY, p_max, (1.0 - p_max) / (replies - 1))


def population(modes: jax.Array, eps: jax.Array, replies: int) -> jax.Array:
    """[K, U]: simulator k answers modes[k] with probability 1 - eps[k], the others evenly."""
    mode = jax.nn.one_hot(modes, replies, dtype=eps.dtype)
    return (1.0 - eps[:, None]) * mode + eps[:, None] * (1.0 - mode) / (replies - 1)


def deviation(reply_probs: jax.Array) -> jax.Array:
    """eps = 1 - max_u phi(u) of a reply distribution [..., U]."""
    (eps,) = toy.deviation((reply_probs,))
    return eps


def population_deviation_bound(eps: jax.Array) -> jax.Array:
    """1 - 1/K - mean_k eps_k: lower bound on the mixture's deviation when the K modes differ pairwise.

    The mixture's top reply u gets at most 1 from the simulator whose mode it is and at most eps_k from each
    other simulator k, so max_u phi_mix(u) <= (1 + sum_k eps_k) / K.
    """
    return 1.0 - 1.0 / eps.shape[-1] - jnp.mean(eps, axis=-1)


def random_populations(rng: np.random.Generator, n: int, size: int,
                       replies: int) -> tuple[np.ndarray, np.ndarray]:
    """n populations of K = size simulators [n, K, U] with pairwise different modes.

    Simulator k keeps its mode with probability 1 - eps_k, eps_k uniform on [0, 1/2], and spreads the rest at
    random over its other replies (so its mode stays its top reply). Returns (sims, eps [n, K]).
    """
    modes = np.argsort(rng.uniform(size=(n, replies)), axis=-1)[:, :size]
    mode = np.eye(replies)[modes]
    eps = rng.uniform(0.0, 0.5, (n, size))
    rest = rng.dirichlet(np.ones(replies), (n, size)) * (1.0 - mode)
    rest /= rest.sum(axis=-1, keepdims=True)
    return (1.0 - eps[..., None]) * mode + eps[..., None] * rest, eps


def trained_policy(values: jax.Array, eta: float, beta: float, steps: int) -> jax.Array:
    """pi after `steps` mirror-descent steps from the uniform pi_ref on the given action values [..., A]."""
    log_ref = jnp.full_like(values, -jnp.log(values.shape[-1]))
    return jnp.exp(concentration.mirror_descent(log_ref, log_ref, values, eta, beta, steps)[-1])
