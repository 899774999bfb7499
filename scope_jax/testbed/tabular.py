"""Co-training in the tabular persona game with exact gradients.

The neural testbed's question without its noise: the agent is a table of logits [N_STATES, N_AGENT]
(softmax per decision state), the simulator a table of logits [N_STATES, S, U] (softmax per (state,
strategy)), and the agent's value V(agent, sim) is exact (`gradients.policy_value`, the traceable twin
of `personas.policy_value`), so both players follow exact gradients. Every step both gradients are
taken at the same point, then both players move (Adam):

  agent      ascends V(pi, q) against the current simulator q;
  simulator  ascends  sign V(pi, q) + best_response V(pi*, q)
                      + entropy_coef H_w(q) - kl_coef KL_w(q_start || q),

where pi* is the exact best response to q (`best_response`, backward induction) held fixed for the step:
by the envelope theorem d/dq max_pi V(pi, q) = dV(pi*, q)/dq, so `regret` (sign -1, best_response 1)
follows the gradient of V(pi*, q) - V(pi, q), PAIRED's oracle form. H_w and KL_w average over the
simulator's turns on policy, weight w(i, s) = reach(i) pi(s | i) normalised to 1 (held fixed, like the
neural testbed's per-token KL averaged over the sampled replies; KL(q_start || q) is the divergence
whose gradient the neural k3 estimator follows, `algorithms.kl`). The objectives are data (`Objective`),
and a frozen control is a simulator learning rate of 0: Adam's update times 0 keeps it bit for bit.

A run is one `Setting` (objective, KL weight, simulator rate, start) and one seed; since everything
else is exact, a seed is only a perturbation of the agent's initial logits (`initial_agent`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from scope_jax.envs import personas
from scope_jax.testbed import gradients
from scope_jax.testbed.evaluate import LEVELS

AGENT_SHAPE = (personas.N_STATES, personas.N_AGENT)
SIM_SHAPE = (personas.N_STATES, personas.N_STRATEGIES, personas.N_USER)
ASK_FLOOR = 1e-3  # the untrained agent never asks before it must; its initial logits floor that 0 here


@dataclasses.dataclass(frozen=True)
class Objective:
    """The simulator's gain: sign V(agent, q) + best_response V(pi*, q) + entropy_coef H_w(q)."""

    sign: float
    best_response: float = 0.0
    entropy_coef: float = 0.0


OBJECTIVES = {"adversarial": Objective(-1.0), "cooperative": Objective(1.0),
              "regret": Objective(-1.0, best_response=1.0),
              "adversarial_entropy": Objective(-1.0, entropy_coef=0.1)}


class Setting(NamedTuple):
    """One arm as arrays (vmapped over settings): its objective's coefficients, the simulator's KL
    weight and learning rate (0: frozen), and its start (the KL anchor too) as logits."""

    sign: jax.Array
    best_response: jax.Array
    entropy_coef: jax.Array
    kl_coef: jax.Array
    sim_learning_rate: jax.Array
    sim_start: jax.Array  # [N_STATES, S, U] logits


def setting(objective: Objective, kl_coef: float, sim_learning_rate: float, sim_start: np.ndarray) -> Setting:
    chex.assert_shape(sim_start, SIM_SHAPE)
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Setting(f(objective.sign), f(objective.best_response), f(objective.entropy_coef), f(kl_coef),
                   f(sim_learning_rate), f(sim_start))


def sim_logits(table: np.ndarray) -> np.ndarray:
    """Logits of a reply table with positive entries (the base and the collapsed simulator)."""
    if (table <= 0).any():
        raise ValueError("a simulator's start needs positive reply probabilities (its logits are log q)")
    return np.log(table).astype(np.float32)


def initial_agent(seed: int, noise: float) -> np.ndarray:
    """The untrained agent's logits, log max(p4g, ASK_FLOOR), plus noise x N(0, 1) drawn from `seed`."""
    logits = np.log(np.maximum(personas.p4g_policy(), ASK_FLOOR))
    return (logits + noise * np.random.default_rng(seed).standard_normal(AGENT_SHAPE)).astype(np.float32)


def value(agent_logits: jax.Array, sim_logits: jax.Array) -> jax.Array:
    """V(softmax agent, softmax simulator), exact over all trajectories."""
    return gradients.policy_value(jax.nn.softmax(agent_logits), jax.nn.softmax(sim_logits))


def best_response(sim: jax.Array) -> jax.Array:
    """pi* [N_STATES, N_AGENT] one-hot against reply table sim [N_STATES, S, U], by backward induction
    (`personas.best_response`, traceable; ties to the lowest action)."""
    chex.assert_shape(sim, SIM_SHAPE)
    continuation = jnp.asarray(gradients.FINAL_REWARD)  # [n_last, 1, U]
    q = []
    for t in reversed(range(personas.TURNS)):
        q_level = jnp.concatenate([jnp.sum(sim[LEVELS[t]] * continuation, -1),
                                   jnp.asarray(gradients.ASK_REWARD[LEVELS[t], None])], -1)
        q.insert(0, q_level)
        if t > 0:
            continuation = q_level.max(-1).reshape(-1, personas.N_STRATEGIES, personas.N_USER)
    return jax.nn.one_hot(jnp.argmax(jnp.concatenate(q), -1), personas.N_AGENT, dtype=sim.dtype)


def turn_weights(policy: jax.Array, sim: jax.Array) -> jax.Array:
    """w[i, s] = reach(i) pi(s | i), normalised: where the simulator speaks, on policy."""
    w = gradients.reach_probabilities(policy, sim)[:, None] * policy[:, :personas.N_STRATEGIES]
    return w / w.sum()


def kl_to_start(w: jax.Array, logits: jax.Array, start: jax.Array) -> jax.Array:
    """KL_w(q_start || q) = sum_{i,s} w[i, s] KL(q_start(. | i, s) || q(. | i, s))."""
    log_ref = jax.nn.log_softmax(start)
    return jnp.sum(w * jnp.sum(jnp.exp(log_ref) * (log_ref - jax.nn.log_softmax(logits)), -1))


def sim_gain(logits: jax.Array, policy: jax.Array, s: Setting) -> jax.Array:
    """The simulator's objective at its logits, the agent's policy held fixed."""
    q, log_q = jax.nn.softmax(logits), jax.nn.log_softmax(logits)
    pi_star = jax.lax.stop_gradient(best_response(q))
    w = jax.lax.stop_gradient(turn_weights(policy, q))
    entropy = jnp.sum(w * -jnp.sum(q * log_q, -1))
    return (s.sign * gradients.policy_value(policy, q) + s.best_response * gradients.policy_value(pi_star, q)
            + s.entropy_coef * entropy - s.kl_coef * kl_to_start(w, logits, s.sim_start))


class State(NamedTuple):
    agent: jax.Array  # [N_STATES, N_AGENT] logits
    sim: jax.Array  # [N_STATES, S, U] logits
    agent_opt: optax.OptState
    sim_opt: optax.OptState


class Log(NamedTuple):
    train_value: jax.Array  # V(agent, its simulator) before the step


_ADAM = optax.scale_by_adam()


def init(agent: jax.Array, s: Setting) -> State:
    return State(agent, s.sim_start, _ADAM.init(agent), _ADAM.init(s.sim_start))


def step(state: State, s: Setting, agent_learning_rate: float) -> tuple[State, Log]:
    """One simultaneous step: both exact gradients at (agent, sim), then both Adam moves."""
    train_value, g_agent = jax.value_and_grad(value)(state.agent, state.sim)
    g_sim = jax.grad(sim_gain)(state.sim, jax.nn.softmax(state.agent), s)
    u_agent, agent_opt = _ADAM.update(g_agent, state.agent_opt)
    u_sim, sim_opt = _ADAM.update(g_sim, state.sim_opt)
    return State(state.agent + agent_learning_rate * u_agent, state.sim + s.sim_learning_rate * u_sim,
                 agent_opt, sim_opt), Log(train_value)


def train(state: State, s: Setting, agent_learning_rate: float, steps: int) -> tuple[State, Log]:
    """`steps` steps of one run (scan); vmap it over runs."""
    return jax.lax.scan(lambda st, _: step(st, s, agent_learning_rate), state, None, length=steps)


class Outcome(NamedTuple):
    """A run's numbers at its end."""

    heldout_value: jax.Array  # V(agent, base simulator): the population
    train_value: jax.Array  # V(agent, its simulator)
    sim_deviation: jax.Array  # on-policy mean 1 - max_u q(u | i, s) (`personas.simulator_deviation`)
    sim_kl_to_start: jax.Array  # KL_w(q_start || q) on policy


def outcome(state: State, s: Setting, base_logits: jax.Array) -> Outcome:
    policy, q = jax.nn.softmax(state.agent), jax.nn.softmax(state.sim)
    w = turn_weights(policy, q)
    return Outcome(value(state.agent, base_logits), gradients.policy_value(policy, q),
                   jnp.sum(w * (1.0 - q.max(-1))), kl_to_start(w, state.sim, s.sim_start))
