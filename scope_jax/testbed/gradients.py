"""Theorem 3.2 measured in the neural run: exact policy gradients against three users.

The agent's value V(theta; q) = E[reward] when the transformer agent pi_theta (read out at every
decision state, `persona_lm.agent_policy_table`) talks to the tabulated user q is a polynomial in the
table entries (`policy_value`, the jnp twin of `personas.policy_value`), so its gradient with respect to
the agent's parameters is exact: one forward over the 2,551 decision states, d V / d pi by autodiff
through the table, and one vector-Jacobian product back to the parameters per user. `GradientPanel`
compares the gradient against the simulator the arm trains with (g_train; several members: the mean of
their values, as the blocks of a step are) with the gradient against that simulator's mode user (every
reply replaced by its most probable one, g_mode) and against the ground-truth population (g_pop).
Theorem 3.2 bounds ||g_train - g_mode|| by the on-policy deviation of the simulator; as the agent
settles where its simulator is confident, g_train should approach g_mode and leave g_pop.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed.evaluate import LEVELS

ASK_REWARD = personas.reward(personas.STATE_SCORE).astype(np.float32)  # R when asking at state i
FINAL_REWARD = personas.reward(personas.STATE_SCORE[LEVELS[-1], None, None]
                                + personas.SCORE_WEIGHTS).astype(np.float32)  # [n_last, 1, U]


POLICY_TABLE = jax.jit(lm.agent_policy_table, static_argnums=0)  # shared with testbed.tabulation's Tabulator


def _flow(reach: jax.Array, policy: jax.Array, sim: jax.Array, t: int) -> jax.Array:
    """P(pass through state i of level t, play strategy s, hear u) [n, S, U] (`personas._flow`)."""
    return reach[:, None, None] * policy[LEVELS[t], :personas.N_STRATEGIES, None] * sim[LEVELS[t]]


def reach_probabilities(policy: jax.Array, sim: jax.Array) -> jax.Array:
    """P(the dialogue passes through decision state i) [N_STATES] (traceable `personas.reach_probabilities`)."""
    chex.assert_shape([policy, sim], [(personas.N_STATES, personas.N_AGENT),
                                      (personas.N_STATES, personas.N_STRATEGIES, personas.N_USER)])
    reach = [jnp.ones((1,), policy.dtype)]
    for t in range(personas.TURNS - 1):
        reach.append(_flow(reach[t], policy, sim, t).reshape(-1))
    return jnp.concatenate(reach)


def policy_value(policy: jax.Array, sim: jax.Array) -> jax.Array:
    """E[reward] of policy [N_STATES, N_AGENT] against sim [N_STATES, S, U], exactly (traceable)."""
    reach = reach_probabilities(policy, sim)
    asked = jnp.sum(reach * policy[:, personas.ASK] * ASK_REWARD)
    return asked + jnp.sum(_flow(reach[LEVELS[-1]], policy, sim, personas.TURNS - 1) * FINAL_REWARD)


def mode_user(sim: jax.Array) -> jax.Array:
    """The deterministic user that always gives the simulator's most probable reply (ties: lowest act)."""
    return jax.nn.one_hot(jnp.argmax(sim, axis=-1), sim.shape[-1], dtype=sim.dtype)


def _cos(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b / jnp.maximum(jnp.linalg.norm(a) * jnp.linalg.norm(b), 1e-30)


class GradientPanel:
    """Jitted: (agent params, train simulators [P, N, S, U], population [N, S, U]) -> the panel's numbers:
    grad_cos_mode = cos(g_train, g_mode), grad_cos_population = cos(g_train, g_pop),
    grad_dist_mode = ||g_train - g_mode||, grad_norm = ||g_train||.

    Two programs: the three users' d V / d pi (cheap; one compilation per P) and the pullback through the
    transformer (one compilation, whatever P)."""

    KEYS = ("grad_cos_mode", "grad_cos_population", "grad_dist_mode", "grad_norm")

    def __init__(self, graphdef: nnx.GraphDef):
        self.graphdef = graphdef

        def cotangents(policy, train, population):
            mean_value = lambda pi, sims: jnp.mean(jax.vmap(policy_value, (None, 0))(pi, sims))
            users = (train, jax.vmap(mode_user)(train), population[None])
            return jnp.stack([jax.grad(mean_value)(policy, sims) for sims in users])

        def panel(params, cotangents):
            _, pullback = jax.vjp(lambda p: lm.agent_policy_table(graphdef, p), params)
            flat = lambda tree: jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])
            g_train, g_mode, g_pop = jax.vmap(lambda c: flat(pullback(c)[0]))(cotangents)
            return dict(zip(self.KEYS, (_cos(g_train, g_mode), _cos(g_train, g_pop),
                                        jnp.linalg.norm(g_train - g_mode), jnp.linalg.norm(g_train))))

        self._cotangents, self._panel = jax.jit(cotangents), jax.jit(panel)

    def __call__(self, params, train: np.ndarray, population: np.ndarray) -> dict[str, float]:
        policy = POLICY_TABLE(self.graphdef, params)
        cotangents = self._cotangents(policy, jnp.asarray(train, jnp.float32), jnp.asarray(population, jnp.float32))
        return {k: float(v) for k, v in self._panel(params, cotangents).items()}
