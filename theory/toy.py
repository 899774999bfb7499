"""The exact tabular model: a softmax agent and a user simulator talking for T turns.

A context x is drawn from rho; then for t = 1..T the agent picks a_t ~ pi(.|h_t) and the simulator replies
u_t ~ phi(.|h_t, a_t), with h_1 = x and h_{t+1} = (h_t, a_t, u_t). The episode's reward is
R(x, a_1, u_1, ..., a_T, u_T) in [r_min, r_max]. Every quantity below is a sum over all X (A U)^T
trajectories, so it is exact; no sampling anywhere.

Array layout, with 0-based turn index t = 0..T-1 and a history h_t indexed by (x, a_1, u_1, ..., a_t, u_t):

    logits[t]  [X, (A, U) * t, A]      the agent's tabular softmax logits, one per (history, action)
    sim[t]     [X, (A, U) * t, A, U]   phi(u | h_t, a)
    reward     [X, (A, U) * T]         R(trajectory)

Functions act on one instance; the experiments `jax.vmap` them over a leading instance axis, on random
instances drawn here with numpy (float64). Run them under `jax.enable_x64(True)`: the identities the theory
checks hold to 1e-10 only in float64.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Tables = tuple[jax.Array, ...]  # one array per turn


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of a game: contexts X, agent actions A, simulator replies U, horizon T."""

    contexts: int
    actions: int
    replies: int
    horizon: int

    def history(self, t: int) -> tuple[int, ...]:
        """Shape of the history axes at 0-based turn t: (X, A, U, ..., A, U) with t (A, U) pairs."""
        return (self.contexts,) + (self.actions, self.replies) * t


class Game(NamedTuple):
    """One instance: context distribution rho [X], simulator tables sim[t], reward table."""

    rho: jax.Array
    sim: Tables
    reward: jax.Array


def policy(logits: Tables) -> Tables:
    """pi(a | h) = softmax(logits[h])_a at every history of every turn."""
    return tuple(jax.nn.softmax(table, axis=-1) for table in logits)


def turn_probs(pi: Tables, sim: Tables, start: jax.Array) -> tuple[Tables, jax.Array]:
    """Joint probabilities, weighting context x by start[x]: per turn P(h_t, a_t), and P(trajectory).

    start = rho gives probabilities; start = ones gives probabilities conditional on x.
    """
    reach, per_turn = start, []
    for pi_t, sim_t in zip(pi, sim):
        joint = reach[..., None] * pi_t
        per_turn.append(joint)
        reach = joint[..., None] * sim_t
    return tuple(per_turn), reach


def expected_return(logits: Tables, game: Game) -> jax.Array:
    """J = E_{x ~ rho, pi, phi}[R], summed exactly over trajectories."""
    _, p = turn_probs(policy(logits), game.sim, game.rho)
    return jnp.sum(p * game.reward)


def mode_user(sim: Tables) -> Tables:
    """The mode user: always answers m(h, a) = argmax_u phi(u | h, a) (first maximiser on ties)."""
    return tuple(jax.nn.one_hot(jnp.argmax(s, axis=-1), s.shape[-1], dtype=s.dtype) for s in sim)


def deviation(sim: Tables) -> Tables:
    """eps(h, a) = 1 - phi(m(h, a) | h, a): the probability that phi does not give its mode reply."""
    return tuple(1.0 - jnp.max(s, axis=-1) for s in sim)


def toward_mode(sim: Tables, s: jax.Array) -> Tables:
    """(1 - s) * mode user + s * phi: same mode replies, deviation exactly s * eps(h, a), for s in [0, 1]."""
    return tuple((1.0 - s) * m + s * p for m, p in zip(mode_user(sim), sim))


def per_context(a: jax.Array) -> jax.Array:
    """Sum over every axis but the leading context axis."""
    return a.reshape(a.shape[0], -1).sum(axis=1)


def turn_deviation(pi: Tables, sim: Tables, start: jax.Array) -> jax.Array:
    """[X, T]: sum over (h_t, a_t) of P(h_t, a_t) eps(h_t, a_t), with contexts weighted by start.

    With start = ones this is E[eps(h_t, a_t) | x], the on-policy deviation at turn t in context x.
    """
    joint, _ = turn_probs(pi, sim, start)
    return jnp.stack([per_context(p * e) for p, e in zip(joint, deviation(sim))], axis=-1)


def backward_values(pi: Tables, sim: Tables, reward: jax.Array) -> tuple[Tables, Tables]:
    """Q_t(h, a) = E[R | h_t = h, a_t = a] and V_t(h) = E[R | h_t = h], for t = 0..T (V_T = R).

    Q_t(h, a) = sum_u phi(u | h, a) V_{t+1}(h, a, u) and V_t(h) = sum_a pi(a | h) Q_t(h, a).
    """
    q, v = [], [reward]
    for pi_t, sim_t in zip(reversed(pi), reversed(sim)):
        q.insert(0, jnp.sum(sim_t * v[0], axis=-1))
        v.insert(0, jnp.sum(pi_t * q[0], axis=-1))
    return tuple(q), tuple(v)


def one_turn_values(game: Game) -> jax.Array:
    """[..., X, A]: Q(x, a) = sum_u phi(u | x, a) R(x, a, u) of a one-turn game (independent of pi).

    Like mode_user and deviation, it acts elementwise, so it takes a batch of instances as well.
    """
    (sim,) = game.sim
    return jnp.sum(sim * game.reward, axis=-1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _per_instance(values: np.ndarray, ndim: int) -> np.ndarray:
    """values [n] -> [n, 1, ..., 1] with ndim axes, to scale a batch of tables instance by instance."""
    return np.asarray(values, np.float64).reshape((-1,) + (1,) * (ndim - 1))


def random_games(rng: np.random.Generator, shape: Shape, sim_scale: np.ndarray, r_min: float = 0.0,
                 r_max: float = 1.0, binary: bool = False) -> Game:
    """len(sim_scale) random instances stacked on a leading axis (numpy float64).

    rho ~ Dirichlet(1); phi = softmax(sim_scale * N(0, 1)), so a large scale makes a near-deterministic
    simulator (eps -> 0); R uniform on [r_min, r_max], or uniform on {r_min, r_max} when binary.
    """
    n = len(sim_scale)
    rho = rng.dirichlet(np.ones(shape.contexts), size=n)
    sim = []
    for t in range(shape.horizon):
        z = rng.standard_normal((n,) + shape.history(t) + (shape.actions, shape.replies))
        sim.append(_softmax(_per_instance(sim_scale, z.ndim) * z))
    reward_shape = (n,) + shape.history(shape.horizon)
    unit = rng.integers(0, 2, reward_shape).astype(np.float64) if binary else rng.uniform(size=reward_shape)
    return Game(rho, tuple(sim), r_min + (r_max - r_min) * unit)


def random_logits(rng: np.random.Generator, shape: Shape, scale: np.ndarray) -> Tables:
    """len(scale) instances of agent logits scale * N(0, 1); a large scale makes pi concentrated."""
    tables = []
    for t in range(shape.horizon):
        z = rng.standard_normal((len(scale),) + shape.history(t) + (shape.actions,))
        tables.append(_per_instance(scale, z.ndim) * z)
    return tuple(tables)
