"""Co-training in the tabular persona game with exact gradients.

The neural testbed's question without its noise: the agent is a table of logits [N_STATES, N_AGENT]
(softmax per decision state), the simulator a table of logits [N_STATES, S, U] (softmax per (state,
strategy)), and the agent's value V(agent, sim) is exact (`gradients.policy_value`, the traceable twin
of `personas.policy_value`), so both players follow exact gradients. Every step both gradients are
taken at the same point, then both players move (Adam):

  agent      ascends V(pi, q) against the current simulator q;
  simulator  ascends  sign V(pi, q) + best_response V(pi*, q)
                      + entropy_coef H_w(q) - kl_coef KL_w(q_start || q) - data_coef NLL_data(q),

where pi* is the exact best response to q (`best_response`, backward induction) held fixed for the step:
by the envelope theorem d/dq max_pi V(pi, q) = dV(pi*, q)/dq, so `regret` (sign -1, best_response 1)
follows the gradient of V(pi*, q) - V(pi, q), PAIRED's oracle form. H_w and KL_w average over the
simulator's turns on policy, weight w(i, s) = reach(i) pi(s | i) normalised to 1 (held fixed, like the
neural testbed's per-token KL averaged over the sampled replies; KL(q_start || q) is the divergence
whose gradient the neural k3 estimator follows, `algorithms.kl`). The objectives are data (`Objective`),
and a frozen control is a simulator learning rate of 0: Adam's update times 0 keeps it bit for bit.
NLL_data is the mean NLL per reply of user dialogues (their reply counts, `Setting.data_counts`), the
data anchor of the scarce-data arms.

The agent plays P simulators (a population: member p with its own `Setting`, the state's leading
axis), each episode answered by one of them with equal weight, as the neural `mixture` mode plays:
its value is the mean of V(pi, q_p), and each member follows its own objective against the agent.

A run is one `Setting` (objective, KL weight, simulator rate, start) and one seed; since everything
else is exact, a seed is only a perturbation of the agent's initial logits (`initial_agent`).

Simulators fitted to user dialogues (the scarce-data study): the posterior of a Dirichlet on each
(state, strategy)'s reply counts with prior weight x a prior table (`posterior_mean`, the weight chosen
on held-out dialogues by `fit_prior_weight`), and P samples of it (`posterior_samples`).
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
from scope_jax.testbed import gradients, user_data
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
    """One simulator of an arm as arrays (stacked over members by `members`, vmapped over arms): its
    objective's coefficients, KL weight and learning rate (0: frozen), its start (the KL anchor too) as
    logits, and its data anchor: the weight and the reply counts of its user dialogues."""

    sign: jax.Array
    best_response: jax.Array
    entropy_coef: jax.Array
    kl_coef: jax.Array
    sim_learning_rate: jax.Array
    sim_start: jax.Array  # [N_STATES, S, U] logits
    data_coef: jax.Array
    data_counts: jax.Array  # [N_STATES, S, U] reply counts of the anchor's dialogues


def setting(objective: Objective, kl_coef: float, sim_learning_rate: float, sim_start: np.ndarray,
            data_coef: float = 0.0, data_counts: np.ndarray | None = None) -> Setting:
    chex.assert_shape(sim_start, SIM_SHAPE)
    counts = np.zeros(SIM_SHAPE) if data_counts is None else data_counts
    chex.assert_shape(counts, SIM_SHAPE)
    if data_coef > 0 and not counts.sum():
        raise ValueError("a data anchor needs dialogues (its reply counts are all 0)")
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Setting(f(objective.sign), f(objective.best_response), f(objective.entropy_coef), f(kl_coef),
                   f(sim_learning_rate), f(sim_start), f(data_coef), f(counts))


def members(*settings: Setting) -> Setting:
    """The settings of an arm's P simulators, stacked on a leading member axis."""
    return jax.tree.map(lambda *x: jnp.stack(x), *settings)


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


def data_nll(logits: jax.Array, counts: jax.Array) -> jax.Array:
    """Mean NLL per reply of the dialogues with reply counts `counts` under softmax(logits)."""
    return -jnp.sum(counts * jax.nn.log_softmax(logits)) / jnp.maximum(counts.sum(), 1.0)


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
            + s.entropy_coef * entropy - s.kl_coef * kl_to_start(w, logits, s.sim_start)
            - s.data_coef * data_nll(logits, s.data_counts))


def mixture_value(agent_logits: jax.Array, sims: jax.Array) -> jax.Array:
    """The agent's value against the members sims [P, N_STATES, S, U] (logits), equally weighted."""
    return jnp.mean(jax.vmap(value, (None, 0))(agent_logits, sims))


class State(NamedTuple):
    agent: jax.Array  # [N_STATES, N_AGENT] logits
    sim: jax.Array  # [P, N_STATES, S, U] logits
    agent_opt: optax.OptState
    sim_opt: optax.OptState


class Log(NamedTuple):
    train_value: jax.Array  # V(agent, its simulators) before the step


_ADAM = optax.scale_by_adam()


def init(agent: jax.Array, s: Setting) -> State:
    """s: the members' settings [P] (`members`)."""
    chex.assert_rank(s.sim_start, 4)
    return State(agent, s.sim_start, _ADAM.init(agent), _ADAM.init(s.sim_start))


def step(state: State, s: Setting, agent_learning_rate: float, sims_train: bool = True) -> tuple[State, Log]:
    """One simultaneous step: all exact gradients at (agent, sims), then the Adam moves. sims_train
    False skips the simulators' gradients (arms whose every member is frozen: they stay as they are)."""
    train_value, g_agent = jax.value_and_grad(mixture_value)(state.agent, state.sim)
    u_agent, agent_opt = _ADAM.update(g_agent, state.agent_opt)
    sim, sim_opt = state.sim, state.sim_opt
    if sims_train:
        g_sim = jax.vmap(jax.grad(sim_gain), (0, None, 0))(state.sim, jax.nn.softmax(state.agent), s)
        u_sim, sim_opt = _ADAM.update(g_sim, state.sim_opt)
        sim = state.sim + s.sim_learning_rate[:, None, None, None] * u_sim
    return State(state.agent + agent_learning_rate * u_agent, sim, agent_opt, sim_opt), Log(train_value)


def train(state: State, s: Setting, agent_learning_rate: float, steps: int,
          sims_train: bool = True) -> tuple[State, Log]:
    """`steps` steps of one run (scan); vmap it over runs."""
    return jax.lax.scan(lambda st, _: step(st, s, agent_learning_rate, sims_train), state, None, length=steps)


class Outcome(NamedTuple):
    """A run's numbers at its end."""

    heldout_value: jax.Array  # V(agent, base simulator): the population
    train_value: jax.Array  # V(agent, its simulators), mean over members
    sim_deviation: jax.Array  # on-policy mean 1 - max_u q(u | i, s) (`personas.simulator_deviation`)
    sim_kl_to_start: jax.Array  # KL_w(q_start || q) on policy
    regret_train: jax.Array  # V(pi*_q, q) - V(agent, q), pi*_q the exact best response to member q
    regret_users: jax.Array  # the same against the population (the base simulator)
    heldout_nll: jax.Array  # NLL per reply of the held-out counts under the members (mean over members)


def regret(agent_logits: jax.Array, sim_logits: jax.Array) -> jax.Array:
    """V(pi*, q) - V(agent, q) for q = softmax(sim_logits), pi* its exact best response."""
    q = jax.nn.softmax(sim_logits)
    return (gradients.policy_value(best_response(q), q)
            - gradients.policy_value(jax.nn.softmax(agent_logits), q))


def outcome(state: State, s: Setting, base_logits: jax.Array,
            heldout_counts: jax.Array | None = None) -> Outcome:
    """Means over members. heldout_counts [N_STATES, S, U]: reply counts of held-out dialogues (None:
    heldout_nll is 0)."""
    policy = jax.nn.softmax(state.agent)

    def member(logits, start):
        q = jax.nn.softmax(logits)
        w = turn_weights(policy, q)
        return (gradients.policy_value(policy, q), jnp.sum(w * (1.0 - q.max(-1))),
                kl_to_start(w, logits, start), regret(state.agent, logits))

    per_member = jax.vmap(member)(state.sim, s.sim_start)
    nll = (jnp.zeros(()) if heldout_counts is None
           else jnp.mean(jax.vmap(data_nll, (0, None))(state.sim, heldout_counts)))
    return Outcome(value(state.agent, base_logits), *(jnp.mean(x) for x in per_member),
                   regret(state.agent, base_logits), nll)


PRIOR_WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0)  # the Dirichlet prior's weights (in replies) the fit chooses among
SAMPLE_FLOOR = 1e-8  # a posterior sample's probabilities are floored there (its logits stay finite)


def posterior_mean(counts: np.ndarray, prior: np.ndarray, weight: float) -> np.ndarray:
    """E[q | counts] under Dirichlet(weight x prior) at every (state, strategy): [N_STATES, S, U]."""
    return (counts + weight * prior) / (counts.sum(-1, keepdims=True) + weight)


def fit_prior_weight(counts: np.ndarray, prior: np.ndarray, heldout: user_data.Dialogues) -> float:
    """The weight of `PRIOR_WEIGHTS` whose posterior mean gives the held-out dialogues the lowest NLL."""
    nll = [user_data.table_nll(posterior_mean(counts, prior, a), heldout) for a in PRIOR_WEIGHTS]
    return PRIOR_WEIGHTS[int(np.argmin(nll))]


def posterior_samples(counts: np.ndarray, prior: np.ndarray, weight: float, members: int,
                      seed: tuple[int, ...]) -> np.ndarray:
    """[members, N_STATES, S, U] draws of q from Dirichlet(counts + weight x prior) (numpy, from `seed`)."""
    g = np.random.default_rng(seed).gamma(np.broadcast_to(counts + weight * prior, (members, *SIM_SHAPE)))
    q = np.maximum(g / np.maximum(g.sum(-1, keepdims=True), 1e-300), SAMPLE_FLOOR)
    return q / q.sum(-1, keepdims=True)
