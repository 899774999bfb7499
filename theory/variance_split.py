"""Lemma 3.3 (our formalization): reward variance splits into a simulator side and an agent side.

Within one context x (a GRPO group shares x), the Doob martingale E[R | x, a_1, u_1, ..., ] has one increment
per agent move and one per simulator move, and their variances add up (increments are uncorrelated):

    Var(R | x) = sum_t  E[Var_{a_t ~ pi}(Q_t(h_t, a_t)) | x]          agent side, turn t
               + sum_t  E[Var_{u_t ~ phi}(V_{t+1}(h_t, a_t, u_t)) | x]  simulator side, turn t.

For T = 1 this is Var r = E_a[Var_u r] + Var_a[Q_phi(x, a)]. Each simulator term is at most
E[eps(h_t, a_t) | x] * dr^2, because a variable in an interval of length dr that equals its value at the mode
reply with probability 1 - eps has variance at most E[(V - V(m))^2] <= eps * dr^2.

A group of G i.i.d. episodes has zero reward variance when all G rewards coincide; its probability is
exact for binary rewards, and at least the chance that all G episodes follow the same all-mode-reply path.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from theory import toy


class Split(NamedTuple):
    """Var(R | x) and its Doob terms, per context x and turn t."""

    total: jax.Array  # [X]
    agent: jax.Array  # [X, T]
    simulator: jax.Array  # [X, T]


def split(logits: toy.Tables, game: toy.Game) -> Split:
    """The exact Doob decomposition of Var(R | x) (see the module docstring)."""
    pi = toy.policy(logits)
    joint, p_traj = toy.turn_probs(pi, game.sim, jnp.ones_like(game.rho))
    q, v = toy.backward_values(pi, game.sim, game.reward)
    agent = [toy.per_context(p * (q_t - v_t[..., None]) ** 2) for p, q_t, v_t in zip(joint, q, v)]
    simulator = [toy.per_context(p * jnp.sum(s * (v_next - q_t[..., None]) ** 2, axis=-1))
                 for p, s, q_t, v_next in zip(joint, game.sim, q, v[1:])]
    total = toy.per_context(p_traj * game.reward**2) - v[0] ** 2
    return Split(total, jnp.stack(agent, axis=-1), jnp.stack(simulator, axis=-1))


def simulator_bound(logits: toy.Tables, game: toy.Game, dr: float) -> jax.Array:
    """[X, T]: E[eps(h_t, a_t) | x] * dr^2, the bound on turn t's simulator term."""
    return toy.turn_deviation(toy.policy(logits), game.sim, jnp.ones_like(game.rho)) * dr**2


def zero_variance_probability(logits: toy.Tables, game: toy.Game, group_size: int, r_min: float,
                              r_max: float) -> jax.Array:
    """[X]: P(all G rewards of a group equal | x) = p^G + (1 - p)^G, p = P(R = r_max | x); binary R only."""
    _, p_traj = toy.turn_probs(toy.policy(logits), game.sim, jnp.ones_like(game.rho))
    p = toy.per_context(p_traj * (game.reward - r_min)) / (r_max - r_min)
    return p**group_size + (1.0 - p) ** group_size


def zero_variance_lower_bound(logits: toy.Tables, game: toy.Game, group_size: int) -> jax.Array:
    """[X]: sum over agent action sequences of P(that sequence and only mode replies | x)^G.

    One turn: sum_a (pi(a | x) (1 - eps(x, a)))^G >= (pi_max (1 - eps(x, a_max)))^G, which tends to 1 as pi
    concentrates and eps -> 0. Holds for any reward, binary or not.
    """
    mode_path = tuple(s * m for s, m in zip(game.sim, toy.mode_user(game.sim)))
    _, p_mode = toy.turn_probs(toy.policy(logits), mode_path, jnp.ones_like(game.rho))
    return toy.per_context(p_mode**group_size)


def shortcut_group_game(eps: jax.Array, concentration: float, actions: int, r_min: float,
                        r_max: float) -> tuple[toy.Tables, toy.Game]:
    """One context, binary reward; the agent plays action 0 with probability `concentration`, others evenly.
    Action 0 is the shortcut: it pays r_max when the user gives the mode reply (probability 1 - eps), r_min
    otherwise; every other action meets a user who answers either reply with probability 1/2.
    So P(R = r_max) = concentration (1 - eps) + (1 - concentration) / 2.
    """
    eps = jnp.asarray(eps)
    others = jnp.full((actions - 1, 2), 0.5)
    sim = jnp.concatenate([jnp.stack([1.0 - eps, eps])[None], others])[None]
    reward = jnp.broadcast_to(jnp.array([r_max, r_min]), (1, actions, 2))
    pi = jnp.array([concentration] + [(1.0 - concentration) / (actions - 1)] * (actions - 1))
    return (jnp.log(pi)[None],), toy.Game(jnp.ones(1), (sim,), reward)
