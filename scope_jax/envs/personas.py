"""The persona persuasion game: an exact, tabular testbed for simulator collapse.

The game
--------
A persuader (the agent) talks to a persuadee (the user) in a token language of P4G dialogue acts.
Agent acts: the 10 P4G strategies and the donation request (P4G `proposition-of-donation`, index ASK).
The agent plays at most TURNS = 3 strategies, each answered by one user act (positive, negative,
neutral, ask_info, share_personal); the donation request may come at any turn, is forced after the
3rd strategy, and ends the episode with the user's donation

    donation = 2 sigmoid(1.5 (score - 1)) dollars,   score = #positive - #negative + 0.5 #share_personal,

and reward = donation / 2 in (0, 1). Greeting, the P4G opener, is not a decision: every dialogue opens
with it, so it is only the first token of every history (`TOKENS[GREETING]`, a natural BOS for a
sequence model) and no reply depends on it.

The users are a population of four personas, PRIOR = (0.2, 0.3, 0.25, 0.25):

* emotional: likes emotion appeals and personal stories, cool towards logic, credibility, numbers;
* skeptic: likes logical and credibility appeals and donation information, dislikes emotion appeals
  and personal stories;
* relational: warms to foot-in-the-door and self-modeling only after a personal inquiry (cool before);
  lukewarm (indifferent) to emotion;
* reluctant: averse to everything, except credibility once donation information has been given.

A persona's reply to strategy s in context c is the P4G reply distribution after s, tilted along the
score:

    P_p(u | c, s)  ∝  base[s, u] exp(beta_p(c, s) w_u),   w = SCORE_WEIGHTS = (1, -1, 0, 0, 0.5),

so beta > 0 moves mass from negative to positive replies and beta < 0 the other way (`Tilts`: like
1.5, indifferent -0.5, cool -1, averse -2, dislike -3). The context c (`context`) holds the two
history features the personas react to: whether a personal inquiry has been made, and whether
donation information has been given. The first personal inquiry's reply reveals the persona: the
emotional one shares something personal, the skeptic asks about the charity, the relational one
answers positively, the reluctant one neutrally or negatively (1/2 each). A repeated inquiry gets the
tilted base rate like any strategy (otherwise the relational persona would pay +1 per inquiry).

What comes from data and what is synthetic
------------------------------------------
From P4G (`p4g_stats.json`; `p4g_stats.py` recomputes it from the data): the untrained agent (the
persuaders' per-turn strategy frequencies: credibility 30.3%, donation information 14.0%, logical
12.5%, ...; it asks only when it must, after the 3rd strategy), and base[s, u] for the nine
strategies other than the personal inquiry (the persuadees' coarse reply acts in the turn after s).
Synthetic: the personas, their prior, the tilts, the revealing replies, the turn limit and the
reward's slope 1.5. The reward's offset is calibrated on P4G donations: a neutral dialogue (score 0)
gives 2 sigmoid(-1.5) = $0.36, the human mean being $0.35 (982 persuadees, 51.9% donate something);
the game's donation is an expected amount, so the fraction donating has no counterpart. The
population is colder than P4G's chat partners: its first reply after each strategy is 0.14 to 0.37
(total variation) from the P4G rates, mostly mass moved from positive to negative; that is what the
tilts, fitted on a half-point grid to the values of the checked recipe (DESIGN.md), ask for.

Simulators
----------
A simulator is a table sim[i, s, u] = P(u | history of decision state i, strategy s); `tabulate` turns
any function (history, s) -> distribution into one. The base simulator is the population's posterior
predictive, sum_p P(p | history) P_p(u | c, s), which generates exactly the population's trajectory
distribution. The collapsed simulator is the emotional persona made agreeable (negative mass moved to
positive), sharpened by temperature 0.3 and mixed with a 0.05 floor per reply.

Exact evaluation
----------------
Decision states are histories of 0, 1 or 2 (strategy, reply) pairs: 1 + 50 + 2500 = 2551 = N_STATES,
indexed by `state_index`, as tokens in STATE_TOKENS. A tabular policy is an array [N_STATES, N_AGENT]
of action probabilities (a transformer agent is evaluated exactly by reading its probabilities at the
2551 token sequences). `policy_value` sums over all trajectories, `episodes` lists them with their
probabilities, `best_response` does backward induction against any simulator (against the base
simulator: the Bayes-optimal adaptive policy for the population; against one persona: the optimum with
the persona known), `fixed_sequence_values` scores all 1111 open-loop sequences. Exact values on the
population (float64), recipe's in brackets:

    untrained agent (P4G frequencies)     0.3183  (0.305)
    best fixed sequence                   0.4803  (0.502)  donation-information, credibility, credibility
    best adaptive policy                  0.6503  (0.590)  personal inquiry first, then tailored
    persona known                         0.7780  (0.777)
    best response to the collapsed sim.   0.8224 on it (recipe's trained agent 0.916), 0.2901 on the
                                          population (0.282): personal story three times
    deviation on the untrained agent's    base simulator 0.5846, collapsed 0.4025
    dialogues (mean 1 - p_max)

Each persona has its own best fixed sequence (personal story x3, logical x3, inquiry then
self-modeling x2, and the population's best for the reluctant one), so none is best for all.

The tilt levels were chosen on a half-point grid by least squares to the recipe's five values (the
four above and the collapsed best response on the population), among the settings that keep its
structure (best fixed sequence, inquiry first, collapse below the untrained agent). The adaptive
headroom over the best fixed sequence stays larger than the recipe's (0.17 against 0.09): continuous
fits of this family, even with a like level per persona, leave the adaptive value at 0.60 to 0.64,
because the revealing replies score themselves (+1 for the relational persona, +0.5 for the
emotional one) and the relational persona's own optimum starts with the inquiry, so inquiring first
costs the adaptive agent little. The collapsed simulator's floor keeps every reply at 0.05 or more,
which caps its best response below the recipe's 0.916. The skeptic's dislike of emotion covers
personal stories too: without it, the collapsed simulator's favourite act does not hurt the others
and training on it does not fall below the untrained agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from scope_jax.envs import p4g_stats

STRATEGIES: tuple[str, ...] = p4g_stats.STRATEGIES
AGENT_ACTS: tuple[str, ...] = STRATEGIES + (p4g_stats.DONATION_REQUEST,)
USER_ACTS: tuple[str, ...] = p4g_stats.USER_ACTS
N_STRATEGIES, N_AGENT, N_USER = len(STRATEGIES), len(AGENT_ACTS), len(USER_ACTS)
(LOGICAL, EMOTION, CREDIBILITY, FOOT_IN_DOOR, SELF_MODELING, PERSONAL_STORY, DONATION_INFO,
 SOURCE_INQUIRY, TASK_INQUIRY, PERSONAL_INQUIRY) = range(N_STRATEGIES)  # fmt: skip
ASK = N_STRATEGIES
POSITIVE, NEGATIVE, NEUTRAL, ASK_INFO, SHARE_PERSONAL = range(N_USER)
SCORE_WEIGHTS = np.array([1.0, -1.0, 0.0, 0.0, 0.5])

PERSONAS: tuple[str, ...] = ("emotional", "skeptic", "relational", "reluctant")
EMOTIONAL, SKEPTIC, RELATIONAL, RELUCTANT = range(len(PERSONAS))
PRIOR = np.array([0.2, 0.3, 0.25, 0.25])

TURNS = 3  # strategies before the donation request is forced
N_CONTEXTS = 4  # 2 * inquired + informed, see acts_context
INQUIRED = np.arange(N_CONTEXTS) // 2 == 1
INFORMED = np.arange(N_CONTEXTS) % 2 == 1

# Tokens of a dialogue: the greeting opener, the agent acts, the user acts.
TOKENS: tuple[str, ...] = ("greeting",) + AGENT_ACTS + USER_ACTS
GREETING, AGENT_TOKEN0, USER_TOKEN0 = 0, 1, 1 + N_AGENT
PAD = -1

History = Sequence[tuple[int, int]]  # (strategy, reply) pairs
SimulatorFn = Callable[[History, int], np.ndarray]


# reward = donation / 2 = sigmoid(REWARD_SLOPE (score - REWARD_MIDPOINT)); also traced in persona_lm.
REWARD_SLOPE, REWARD_MIDPOINT = 1.5, 1.0


def reward(score: np.ndarray | float) -> np.ndarray:
    """donation / 2 = sigmoid(1.5 (score - 1))."""
    return 1.0 / (1.0 + np.exp(-REWARD_SLOPE * (np.asarray(score, dtype=np.float64) - REWARD_MIDPOINT)))


def score(history: History) -> float:
    """#positive - #negative + 0.5 #share_personal over the user's replies."""
    return float(sum(SCORE_WEIGHTS[u] for _, u in history))


def acts_context(acts: Iterable[int]) -> int:
    """The features the personas react to: 2 * (personal inquiry made) + (donation information given)."""
    acts = set(acts)
    return 2 * (PERSONAL_INQUIRY in acts) + (DONATION_INFO in acts)


def context(history: History) -> int:
    """`acts_context` of the agent's acts in a history: the replies do not enter the context."""
    return acts_context(a for a, _ in history)


# ----------------------------------------------------------------------------------------------------
# The population


@dataclasses.dataclass(frozen=True)
class Tilts:
    """Synthetic persona preferences: the beta of each kind of reaction in P ∝ base exp(beta w).

    The levels were fitted, on a grid of half-points, to the values of the checked recipe (DESIGN.md).
    """

    like: float = 1.5
    indifferent: float = -0.5  # a game persuadee is a little harder to please than a P4G chat partner
    cool: float = -1.0
    averse: float = -2.0
    dislike: float = -3.0


def persona_betas(tilts: Tilts = Tilts()) -> np.ndarray:
    """beta[p, c, s]: how persona p takes strategy s in context c."""
    beta = np.full((len(PERSONAS), N_CONTEXTS, N_STRATEGIES), tilts.indifferent)
    beta[EMOTIONAL, :, [EMOTION, PERSONAL_STORY]] = tilts.like
    beta[EMOTIONAL, :, [LOGICAL, CREDIBILITY, DONATION_INFO]] = tilts.cool
    beta[SKEPTIC, :, [LOGICAL, CREDIBILITY, DONATION_INFO]] = tilts.like
    beta[SKEPTIC, :, [EMOTION, PERSONAL_STORY]] = tilts.dislike
    for s in (FOOT_IN_DOOR, SELF_MODELING):
        beta[RELATIONAL, :, s] = np.where(INQUIRED, tilts.like, tilts.cool)
    beta[RELUCTANT] = tilts.averse
    beta[RELUCTANT, INFORMED, CREDIBILITY] = tilts.like
    return beta


# P_p(u | personal inquiry): the reply reveals the persona.
REVEAL = np.zeros((len(PERSONAS), N_USER))
REVEAL[EMOTIONAL, SHARE_PERSONAL] = 1.0
REVEAL[SKEPTIC, ASK_INFO] = 1.0
REVEAL[RELATIONAL, POSITIVE] = 1.0
REVEAL[RELUCTANT, [NEUTRAL, NEGATIVE]] = 0.5


def persona_tables(stats: dict | None = None, tilts: Tilts = Tilts()) -> np.ndarray:
    """tables[p, c, s, u] = P_p(u | c, s): the P4G base rates tilted by beta, the reveal for the inquiry."""
    stats = p4g_stats.load_stats() if stats is None else stats
    counts = np.asarray(stats["reply_counts"], dtype=np.float64)
    base = counts / counts.sum(-1, keepdims=True)
    logits = np.log(base) + persona_betas(tilts)[..., None] * SCORE_WEIGHTS
    tables = np.exp(logits - logits.max(-1, keepdims=True))
    tables /= tables.sum(-1, keepdims=True)
    tables[:, ~INQUIRED, PERSONAL_INQUIRY] = REVEAL[:, None]  # the first inquiry; later ones are tilted
    return tables


TABLES = persona_tables()


def reply_distribution(persona: int, history: History, act: int, tables: np.ndarray = TABLES) -> np.ndarray:
    """P_persona(u | history, act) for a strategy act."""
    return tables[persona, context(history), act]


# ----------------------------------------------------------------------------------------------------
# Decision states: histories of 0..TURNS-1 (strategy, reply) pairs, level by level.

BRANCH = N_STRATEGIES * N_USER
LEVEL_OFFSETS = tuple(sum(BRANCH**k for k in range(t)) for t in range(TURNS + 1))  # (0, 1, 51, 2551)
N_STATES = LEVEL_OFFSETS[TURNS]


def state_index(history: History) -> int:
    """The decision state of a history of fewer than TURNS (strategy, reply) pairs."""
    if len(history) >= TURNS:
        raise ValueError(f"a decision state has at most {TURNS - 1} (strategy, reply) pairs, got {history}")
    local = 0
    for a, u in history:
        local = local * BRANCH + a * N_USER + u
    return LEVEL_OFFSETS[len(history)] + local


def state_history(index: int) -> tuple[tuple[int, int], ...]:
    """Inverse of `state_index`."""
    level = max(t for t in range(TURNS) if LEVEL_OFFSETS[t] <= index)
    local, pairs = index - LEVEL_OFFSETS[level], []
    for _ in range(level):
        local, pair = divmod(local, BRANCH)
        pairs.append(divmod(pair, N_USER))
    return tuple(reversed(pairs))


def history_tokens(history: History) -> tuple[int, ...]:
    """The token sequence of a history: greeting, then agent and user act tokens in turn."""
    return (GREETING,) + tuple(tok for a, u in history for tok in (AGENT_TOKEN0 + a, USER_TOKEN0 + u))


STATE_HISTORIES = tuple(state_history(i) for i in range(N_STATES))
STATE_LEVEL = np.array([len(h) for h in STATE_HISTORIES])
STATE_CONTEXT = np.array([context(h) for h in STATE_HISTORIES])
STATE_SCORE = np.array([score(h) for h in STATE_HISTORIES])
STATE_TOKENS = np.array([history_tokens(h) + (PAD,) * 2 * (TURNS - 1 - len(h)) for h in STATE_HISTORIES])
STATE_LENGTH = 1 + 2 * STATE_LEVEL


def _level(t: int) -> slice:
    return slice(LEVEL_OFFSETS[t], LEVEL_OFFSETS[t + 1])


# ----------------------------------------------------------------------------------------------------
# Simulators: tables sim[state, strategy, reply]


def tabulate(simulator: SimulatorFn) -> np.ndarray:
    """sim[i, s] = simulator(history of state i, s) for every decision state and strategy."""
    return np.array([[simulator(h, s) for s in range(N_STRATEGIES)] for h in STATE_HISTORIES], np.float64)


def persona_simulator(persona: int, tables: np.ndarray = TABLES) -> np.ndarray:
    """One persona's replies at every decision state."""
    return tables[persona][STATE_CONTEXT]


def persona_posterior(tables: np.ndarray = TABLES, prior: np.ndarray = PRIOR) -> np.ndarray:
    """P(p | history) [N_STATES, P] by Bayes' rule along the tree.

    Every history has positive probability under the population (the tilted tables are positive, and
    the revealing replies cover all five acts), so the posterior is defined everywhere, also on states
    only other simulators (the collapsed one) visit.
    """
    posterior = np.empty((N_STATES, len(prior)))
    posterior[0] = prior
    for t in range(TURNS - 1):
        likelihood = np.moveaxis(tables[:, STATE_CONTEXT[_level(t)]], 0, -1)  # [n, S, U, P]
        joint = (posterior[_level(t), None, None] * likelihood).reshape(-1, len(prior))
        evidence = joint.sum(-1, keepdims=True)
        if (evidence == 0).any():
            raise ValueError("a history has probability 0 under every persona: the posterior is undefined")
        posterior[_level(t + 1)] = joint / evidence
    return posterior


def base_simulator(tables: np.ndarray = TABLES, prior: np.ndarray = PRIOR) -> np.ndarray:
    """The population's posterior predictive: sum_p P(p | history) P_p(u | c(history), s)."""
    return np.einsum("ip,pisu->isu", persona_posterior(tables, prior), tables[:, STATE_CONTEXT])


def collapsed_simulator(
    tables: np.ndarray = TABLES, persona: int = EMOTIONAL, temperature: float = 0.3, floor: float = 0.05
) -> np.ndarray:
    """A persona made agreeable (negative -> positive), then floor + (1 - U floor) softmax(log P / T)."""
    sharp = agreeable_sharpened(tables[persona], temperature)
    return (floor + (1.0 - N_USER * floor) * sharp)[STATE_CONTEXT]


def agreeable_sharpened(table: np.ndarray, temperature: float) -> np.ndarray:
    """A reply table made agreeable (negative mass moved to positive), then sharpened: q^(1/T), normalised."""
    agreeable = table.copy()
    agreeable[..., POSITIVE] += agreeable[..., NEGATIVE]
    agreeable[..., NEGATIVE] = 0.0
    sharp = agreeable ** (1.0 / temperature)
    return sharp / sharp.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------------------------------
# Exact evaluation


def p4g_policy(stats: dict | None = None) -> np.ndarray:
    """The untrained agent: P4G persuaders' per-turn strategy frequencies, never asking before it must."""
    stats = p4g_stats.load_stats() if stats is None else stats
    freq = np.asarray(stats["strategy_turns"], dtype=np.float64)
    policy = np.zeros((N_STATES, N_AGENT))
    policy[:, :N_STRATEGIES] = freq / freq.sum()
    return policy


def _check_policy(policy: np.ndarray) -> np.ndarray:
    policy = np.asarray(policy, dtype=np.float64)
    if policy.shape != (N_STATES, N_AGENT):
        raise ValueError(f"a policy is [{N_STATES}, {N_AGENT}] action probabilities, got {policy.shape}")
    if (policy < 0).any() or not np.allclose(policy.sum(-1), 1.0):
        raise ValueError("policy rows must be probability distributions")
    return policy


def _flow(reach: np.ndarray, policy: np.ndarray, sim: np.ndarray, t: int) -> np.ndarray:
    """P(pass through state i of level t, play strategy s, hear u) [n, S, U]."""
    lvl = _level(t)
    return reach[lvl, None, None] * policy[lvl, :N_STRATEGIES, None] * sim[lvl]


def reach_probabilities(policy: np.ndarray, sim: np.ndarray) -> np.ndarray:
    """P(the dialogue passes through decision state i) [N_STATES] when `policy` talks to `sim`."""
    policy = _check_policy(policy)
    reach = np.empty(N_STATES)
    reach[0] = 1.0
    for t in range(TURNS - 1):
        reach[_level(t + 1)] = _flow(reach, policy, sim, t).reshape(-1)
    return reach


def _final_rewards() -> np.ndarray:
    """R after a last (strategy, reply) from each state of the last level: [n, S, U]."""
    last = STATE_SCORE[_level(TURNS - 1), None, None] + SCORE_WEIGHTS
    return np.broadcast_to(reward(last), (last.shape[0], N_STRATEGIES, N_USER))


def policy_value(policy: np.ndarray, sim: np.ndarray) -> float:
    """E[reward] of `policy` against `sim`, summed exactly over all trajectories.

    V = sum_i reach_i pi(ASK | i) R(score_i)
        + sum_{i in last level} sum_{s,u} reach_i pi(s | i) sim(u | i, s) R(score_i + w_u).
    """
    policy = _check_policy(policy)
    reach = reach_probabilities(policy, sim)
    asked = np.sum(reach * policy[:, ASK] * reward(STATE_SCORE))
    forced = np.sum(_flow(reach, policy, sim, TURNS - 1) * _final_rewards())
    return float(asked + forced)


class Solution(NamedTuple):
    value: float  # optimal expected reward from the start
    policy: np.ndarray  # [N_STATES, N_AGENT] one-hot, ties to the lowest action index
    state_values: np.ndarray  # [N_STATES] optimal value from each decision state


def best_response(sim: np.ndarray) -> Solution:
    """Backward induction: Q(i, ASK) = R(score_i), Q(i, s) = sum_u sim(u | i, s) V(child(i, s, u)).

    Against the base simulator this is the Bayes-optimal adaptive policy for the population (the
    posterior predictive is the belief MDP's transition); against one persona's table, the optimum with
    the persona known.
    """
    values = np.empty(N_STATES)
    q = np.empty((N_STATES, N_AGENT))
    q[:, ASK] = reward(STATE_SCORE)
    continuation = _final_rewards()
    for t in reversed(range(TURNS)):
        lvl = _level(t)
        q[lvl, :N_STRATEGIES] = np.einsum("isu,isu->is", sim[lvl], continuation)
        values[lvl] = q[lvl].max(-1)
        continuation = values[lvl].reshape(-1, N_STRATEGIES, N_USER) if t > 0 else None
    policy = np.eye(N_AGENT)[q.argmax(-1)]
    return Solution(float(values[0]), policy, values)


def persona_known_value(tables: np.ndarray = TABLES, prior: np.ndarray = PRIOR) -> float:
    """sum_p prior_p max_pi V(pi, persona p): the ceiling when the agent is told who it talks to."""
    return float(sum(w * best_response(persona_simulator(p, tables)).value for p, w in enumerate(prior)))


class FixedSequences(NamedTuple):
    sequences: list[tuple[int, ...]]  # strategies then ASK, 0..TURNS strategies, by length then lexicographic
    values: np.ndarray  # [n_sequences, P]: expected reward against each persona


def fixed_sequence_values(tables: np.ndarray = TABLES) -> FixedSequences:
    """Every open-loop sequence against every persona, exactly.

    A persona's context depends on the agent's acts only, so along a fixed sequence the replies are
    independent and the score distribution is a convolution, built prefix by prefix on half-points:
    dist[prefix + s, p, k] = sum_u P_p(u | c(prefix), s) dist[prefix, p, k - 2 w_u].
    """
    half = 2 * TURNS  # |2 score| <= 2 TURNS
    steps = (2 * SCORE_WEIGHTS).astype(int)
    scores = np.arange(-half, half + 1) / 2
    prefixes: list[tuple[int, ...]] = [()]
    dist = np.zeros((1, len(PERSONAS), 2 * half + 1))
    dist[:, :, half] = 1.0
    sequences, values = [], []
    for t in range(TURNS + 1):
        sequences += [prefix + (ASK,) for prefix in prefixes]
        values.append(dist @ reward(scores))
        if t == TURNS:
            break
        probs = tables[:, [acts_context(prefix) for prefix in prefixes]]  # [P, n, S, U]
        # no wrap-around: after t < TURNS replies |2 score| <= 2t, so one more step stays within +-half
        shifted = np.stack([np.roll(dist, step, axis=-1) for step in steps], axis=-2)  # [n, P, U, K]
        dist = np.einsum("pnsu,npuk->nspk", probs, shifted).reshape(-1, *dist.shape[1:])
        prefixes = [prefix + (s,) for prefix in prefixes for s in range(N_STRATEGIES)]
    return FixedSequences(sequences, np.concatenate(values))


def open_loop_policy(sequence: Sequence[int]) -> np.ndarray:
    """The policy that plays `sequence` (strategies, then ASK) whatever the replies."""
    if not sequence or sequence[-1] != ASK or ASK in sequence[:-1] or len(sequence) > TURNS + 1:
        raise ValueError(f"a fixed sequence is up to {TURNS} strategies followed by ASK, got {sequence}")
    acts = list(sequence) + [ASK] * TURNS
    return np.eye(N_AGENT)[[acts[level] for level in STATE_LEVEL]]


def best_fixed_sequence(
    tables: np.ndarray = TABLES, prior: np.ndarray = PRIOR
) -> tuple[tuple[int, ...], float]:
    """The open-loop sequence with the highest expected reward on the population."""
    fixed = fixed_sequence_values(tables)
    population = fixed.values @ prior
    best = int(population.argmax())
    return fixed.sequences[best], float(population[best])


def simulator_deviation(policy: np.ndarray, sim: np.ndarray) -> float:
    """On-policy mean of 1 - max_u sim(u | i, s) over the simulator's turns when `policy` talks to `sim`."""
    policy = _check_policy(policy)
    weight = reach_probabilities(policy, sim)[:, None] * policy[:, :N_STRATEGIES]
    return float(np.sum(weight * (1.0 - sim.max(-1))) / weight.sum())


class Episodes(NamedTuple):
    tokens: np.ndarray  # [N, 2 TURNS + 2] token ids, right-padded with PAD
    lengths: np.ndarray  # [N]
    probs: np.ndarray  # [N] probability of each complete dialogue; they sum to 1
    rewards: np.ndarray  # [N]


def episodes(policy: np.ndarray, sim: np.ndarray) -> Episodes:
    """Every complete dialogue with positive probability under (policy, sim), as token sequences.

    First the dialogues that ask at a decision state (in state order), then those that play a last
    strategy and are forced to ask (in order of state, strategy, reply).
    """
    policy = _check_policy(policy)
    reach = reach_probabilities(policy, sim)
    asked = np.column_stack([STATE_TOKENS, np.full((N_STATES, 3), PAD)])
    asked[np.arange(N_STATES), STATE_LENGTH] = AGENT_TOKEN0 + ASK
    last = STATE_TOKENS[_level(TURNS - 1)]
    s, u = np.divmod(np.tile(np.arange(BRANCH), len(last)), N_USER)
    ask = np.full_like(s, AGENT_TOKEN0 + ASK)
    forced = np.column_stack([np.repeat(last, BRANCH, axis=0), AGENT_TOKEN0 + s, USER_TOKEN0 + u, ask])
    tokens = np.concatenate([asked, forced])
    lengths = np.concatenate([STATE_LENGTH + 1, np.full(len(forced), forced.shape[1])])
    probs = np.concatenate([reach * policy[:, ASK], _flow(reach, policy, sim, TURNS - 1).reshape(-1)])
    rewards = np.concatenate([reward(STATE_SCORE), _final_rewards().reshape(-1)])
    keep = probs > 0
    return Episodes(tokens[keep], lengths[keep], probs[keep], rewards[keep])
