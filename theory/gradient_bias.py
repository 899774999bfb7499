"""Theorem 3.2 (our formalization): the policy gradient against phi is close to the one against its mode user.

    || grad J_phi - grad J_mode ||_2  <=  dr * G_T * sum_t epsbar_t,    G_T = sqrt(2 T),

with epsbar_t = E_{x ~ rho, pi, phi}[eps(h_t, a_t)] the on-policy deviation at turn t. Proof sketch: with the
baseline b = (r_min + r_max) / 2, grad J = sum_tau P(tau) (R(tau) - b) S(tau) for both simulators, where
S(tau) = sum_t grad log pi(a_t | h_t) is the score; |R - b| <= dr / 2, ||S|| <= G_T, and
||P_phi - P_mode||_1 <= 2 sum_t epsbar_t by swapping phi for the mode user one turn at a time. For T = 1
this is the one-turn form sqrt(2) * epsbar * dr. See theory/README.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from theory import toy


def score_norm_bound(horizon: int) -> float:
    """G_T = sqrt(2 T) >= ||sum_t grad log pi(a_t | h_t)|| for per-history softmax logits."""
    return math.sqrt(2 * horizon)


def max_score_norm(logits: toy.Tables) -> jax.Array:
    """max over trajectories of ||S(tau)||, exactly.

    Turn t's score e_{a_t} - pi(.|h_t) lives in the logits block of h_t, and histories of different turns
    differ, so ||S||^2 = sum_t ||e_{a_t} - pi(.|h_t)||^2 = sum_t (1 - 2 pi(a_t | h_t) + ||pi(.|h_t)||^2).
    """
    squared = jnp.zeros(logits[0].shape[:1])
    for pi_t in toy.policy(logits):
        per_action = squared[..., None] + 1.0 - 2.0 * pi_t + jnp.sum(pi_t**2, axis=-1, keepdims=True)
        squared = per_action[..., None]  # a unit reply axis: broadcasting spreads it over the replies
    return jnp.sqrt(jnp.max(squared))


def gradients(logits: toy.Tables, game: toy.Game) -> tuple[jax.Array, jax.Array]:
    """(grad J_phi, grad J_mode), each flattened over all logits; autodiff of the exactly enumerated J."""
    grad = jax.grad(toy.expected_return)
    g_phi = grad(logits, game)
    g_mode = grad(logits, game._replace(sim=toy.mode_user(game.sim)))
    flat = lambda g: jnp.concatenate([x.ravel() for x in g])
    return flat(g_phi), flat(g_mode)


def bias(logits: toy.Tables, game: toy.Game) -> tuple[jax.Array, jax.Array]:
    """(||grad J_phi - grad J_mode||, cosine between grad J_phi and grad J_mode)."""
    g_phi, g_mode = gradients(logits, game)
    cosine = jnp.dot(g_phi, g_mode) / (jnp.linalg.norm(g_phi) * jnp.linalg.norm(g_mode))
    return jnp.linalg.norm(g_phi - g_mode), cosine


def on_policy_deviation(logits: toy.Tables, game: toy.Game) -> jax.Array:
    """[T]: epsbar_t = E_{x ~ rho, pi, phi}[eps(h_t, a_t)]."""
    return toy.turn_deviation(toy.policy(logits), game.sim, game.rho).sum(axis=0)


def bound(epsbar: jax.Array, dr: float) -> jax.Array:
    """dr * G_T * sum_t epsbar_t for epsbar of shape [..., T]."""
    return dr * score_norm_bound(epsbar.shape[-1]) * epsbar.sum(axis=-1)


def sharp_instance(p: float, eps: float, dr: float) -> tuple[toy.Tables, toy.Game]:
    """A one-turn instance where the bound is nearly attained: measured / bound = 1 - p.

    Two actions with pi = (p, 1 - p); after action 0 the simulator deviates with probability eps to a reply
    worth dr more than its mode reply; action 1 meets a deterministic simulator. Then grad J_phi - grad J_mode
    = (diag pi - pi pi^T)(eps dr, 0), of norm sqrt(2) p (1 - p) eps dr, while epsbar = p eps.
    """
    sim = jnp.array([[[1.0 - eps, eps], [1.0, 0.0]]])
    reward = jnp.array([[[0.0, dr], [0.0, 0.0]]])
    logits = (jnp.log(jnp.array([[p, 1.0 - p]])),)
    return logits, toy.Game(jnp.ones(1), (sim,), reward)
