"""Exact evaluation of a tabulated agent against tabulated simulators (numpy, float64, over all states).

Every quantity sums over all trajectories of the persona game (`personas`), so nothing here is
estimated: a transformer agent is read out at the 2,551 decision states (`persona_lm.agent_policy_table`)
and a transformer simulator at the 25,510 (state, strategy) contexts (`persona_lm.sim_reply_table`).

* value: E[reward] (donation = 2 value); success: P(score >= 1), the persuadee gives at least $1.
* deviation: on-policy mean of 1 - max_u q(u | i, s) (Theorem 3.2's eps, `personas.simulator_deviation`).
* variance split (Lemma 3.3), the Doob decomposition of Var(r) along the dialogue: with Q(i, a) the
  agent's action values and V the state values under (pi, q),

      agent side     = sum_i reach_i Var_{a ~ pi(i)} Q(i, a),
      simulator side = sum_i reach_i sum_s pi(s | i) Var_{u ~ q(i, s)} V(child(i, s, u)),

  and Var(r) = agent side + simulator side; the simulator-side share is their ratio.
* KL to start: on-policy mean of KL(q(. | i, s) || q_start(. | i, s)) over the simulator's turns when
  the agent talks to q, how far a trained simulator moved from where it started (0 for frozen ones).
* regret: V(pi*_q, q) - V(agent, q), pi*_q the exact best response to q, against each training
  simulator (mean over members) and against the population of users: how far the agent is from the
  best it could do against what it trains on, and against the users.
* entropy of the agent's act distribution, averaged over decision states weighted by how often the
  training simulator's dialogues reach them ("on-simulator"), and weighted by the population's excess
  reach max(reach_population - reach_simulator, 0): the states real users bring the agent to but the
  training simulator does not ("off-simulator").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scope_jax.diagnostics import VarianceSplit
from scope_jax.envs import personas

LEVELS = tuple(slice(personas.LEVEL_OFFSETS[t], personas.LEVEL_OFFSETS[t + 1]) for t in range(personas.TURNS))


def success_probability(policy: np.ndarray, sim: np.ndarray, reach: np.ndarray | None = None) -> float:
    """P(score >= 1) = P(donation >= $1), exactly: the episodes that ask at a decision state i, plus
    those that play a last strategy s from a last-level state i and hear u:

        sum_i reach_i pi(ASK | i) 1[score_i >= 1]
        + sum_{i last, s, u} reach_i pi(s | i) q(u | i, s) 1[score_i + w_u >= 1].
    """
    reach = personas.reach_probabilities(policy, sim) if reach is None else reach
    asked = np.sum(reach * policy[:, personas.ASK] * (personas.STATE_SCORE >= 1))
    lvl = LEVELS[-1]
    flow = reach[lvl, None, None] * policy[lvl, :personas.N_STRATEGIES, None] * sim[lvl]
    last = personas.STATE_SCORE[lvl, None, None] + personas.SCORE_WEIGHTS >= 1
    return float(asked + np.sum(flow * last))


def variance_split(policy: np.ndarray, sim: np.ndarray) -> VarianceSplit:
    """The exact Lemma 3.3 split of Var(r) into agent-side and simulator-side terms (module docstring)."""
    reach = personas.reach_probabilities(policy, sim)
    q = np.empty((personas.N_STATES, personas.N_AGENT))
    q[:, personas.ASK] = personas.reward(personas.STATE_SCORE)
    last = personas.STATE_SCORE[LEVELS[-1], None, None] + personas.SCORE_WEIGHTS
    continuation = personas.reward(np.broadcast_to(last, (last.shape[0], personas.N_STRATEGIES,
                                                          personas.N_USER)))
    agent_side = simulator_side = 0.0
    for t in reversed(range(personas.TURNS)):
        lvl = LEVELS[t]
        q[lvl, :personas.N_STRATEGIES] = np.einsum("isu,isu->is", sim[lvl], continuation)
        reply_var = np.einsum("isu,isu->is", sim[lvl],
                              (continuation - q[lvl, :personas.N_STRATEGIES, None]) ** 2)
        simulator_side += np.sum(reach[lvl, None] * policy[lvl, :personas.N_STRATEGIES] * reply_var)
        values = np.sum(policy[lvl] * q[lvl], -1)
        agent_side += np.sum(reach[lvl] * np.sum(policy[lvl] * (q[lvl] - values[:, None]) ** 2, -1))
        if t:
            continuation = values.reshape(-1, personas.N_STRATEGIES, personas.N_USER)
    total = agent_side + simulator_side
    share = simulator_side / total if total > 0 else float("nan")
    return VarianceSplit(float(total), float(simulator_side), float(agent_side), float(share))


def state_entropy(policy: np.ndarray) -> np.ndarray:
    """H(pi(. | i)) in nats at every decision state [N_STATES]."""
    p = np.clip(policy, 1e-300, 1.0)
    return -np.sum(policy * np.log(p), -1)


def _weighted(values: np.ndarray, weights: np.ndarray) -> float:
    total = weights.sum()
    return float(values @ weights / total) if total > 0 else float("nan")


def kl_to_start(policy: np.ndarray, sim: np.ndarray, start: np.ndarray) -> float:
    """On-policy mean of KL(sim(. | i, s) || start(. | i, s)) when `policy` talks to `sim`."""
    weight = personas.reach_probabilities(policy, sim)[:, None] * policy[:, :personas.N_STRATEGIES]
    kl = np.sum(sim * (np.log(np.maximum(sim, 1e-300)) - np.log(np.maximum(start, 1e-300))), -1)
    return _weighted(kl.reshape(-1), weight.reshape(-1))


def regret(policy: np.ndarray, sim: np.ndarray) -> float:
    """V(pi*, sim) - V(policy, sim), pi* the exact best response to sim."""
    return personas.best_response(sim).value - personas.policy_value(policy, sim)


def exact_metrics(policy: np.ndarray, train_sims: Sequence[np.ndarray], population: np.ndarray,
                  heldout_sims: Sequence[np.ndarray], start_sims: Sequence[np.ndarray]) -> dict[str, float]:
    """Every exact metric of one agent policy [N_STATES, N_AGENT].

    train_sims: the arm's training simulators (members, equally weighted; each episode block plays one);
    population: the true users (`personas.base_simulator()`); heldout_sims: independently trained ones;
    start_sims: the training simulators where they started (the same tables for frozen ones).
    """
    value = personas.policy_value(policy, population)
    entropy = state_entropy(policy)
    reach_pop = personas.reach_probabilities(policy, population)
    reach_sim = np.mean([personas.reach_probabilities(policy, q) for q in train_sims], 0)
    splits = [variance_split(policy, q) for q in train_sims]
    heldout = [personas.policy_value(policy, q) for q in heldout_sims]
    return {
        "heldout_value": value,
        "heldout_donation": 2.0 * value,
        "heldout_success": success_probability(policy, population, reach_pop),
        "heldout_sims_value": float(np.mean(heldout)),
        "regret_train": float(np.mean([regret(policy, q) for q in train_sims])),
        "regret_users": regret(policy, population),
        "train_value": float(np.mean([personas.policy_value(policy, q) for q in train_sims])),
        "sim_deviation": float(np.mean([personas.simulator_deviation(policy, q) for q in train_sims])),
        "sim_kl_to_start": float(np.mean([kl_to_start(policy, q, q0)
                                          for q, q0 in zip(train_sims, start_sims)])),
        "sim_variance_share": float(np.nanmean([s.simulator_share for s in splits])),
        "sim_side_variance": float(np.mean([s.simulator_side for s in splits])),
        "reward_variance": float(np.mean([s.total for s in splits])),
        "entropy_on_sim": _weighted(entropy, reach_sim),
        "entropy_off_sim": _weighted(entropy, np.maximum(reach_pop - reach_sim, 0.0)),
        "first_turn_entropy": float(entropy[0]),
        "first_turn_inquiry": float(policy[0, personas.PERSONAL_INQUIRY]),
    }


def reference_values(population: np.ndarray) -> dict[str, dict[str, float]]:
    """The exact ceilings and anchors on the population: value, donation and success of each policy."""
    fixed_seq, _ = personas.best_fixed_sequence()
    adaptive = personas.best_response(population).policy
    policies = {
        "untrained (P4G frequencies)": personas.p4g_policy(),
        "best fixed sequence": personas.open_loop_policy(fixed_seq),
        "best adaptive": adaptive,
        "best response to the collapsed simulator":
            personas.best_response(personas.collapsed_simulator()).policy,
    }
    out = {}
    for name, policy in policies.items():
        value = personas.policy_value(policy, population)
        out[name] = {"value": value, "donation": 2 * value,
                     "success": success_probability(policy, population)}
    known = [personas.best_response(personas.persona_simulator(p)) for p in range(len(personas.PERSONAS))]
    value = float(sum(w * k.value for w, k in zip(personas.PRIOR, known)))
    success = float(sum(w * success_probability(k.policy, personas.persona_simulator(p))
                        for p, (w, k) in enumerate(zip(personas.PRIOR, known))))
    out["persona known"] = {"value": value, "donation": 2 * value, "success": success}
    return out
