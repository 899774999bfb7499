"""The persona game played by transformers: token language, whole episodes on device, exact evaluation.

Token language
--------------
One vocabulary serves both roles. It is `personas.TOKENS` shifted by one (so personas' PAD = -1 becomes
id 0) followed by the simulator's prompt tokens and the Verbalized Sampling tokens:

    0 pad | 1 greeting | 2..12 agent acts (10 strategies, 12 = donation request ASK) | 13..17 reply acts |
    18..21 persona cards | 22 no card | 23 VS request | 24..34 probability bins 0.0, 0.1, ..., 1.0

so `personas.STATE_TOKENS + 1` (pad -> 0) are the agent's views of the 2,551 decision states and a
transformer agent is evaluated exactly by one batched pass over them (`agent_policy_table`).

Views (L = 2 TURNS + 2 = 8 tokens each, right-padded):

    agent      greeting a1 u1 a2 u2 a3 u3 ASK        loss on a_t (t < TURNS); the forced ASK is no decision
    simulator  card greeting a1 u1 a2 u2 a3 u3       loss on u_t; card is a persona card or "no card"

The simulator's view is the agent's shifted right by its card (it also sees an early ASK, which it does
not answer). With Verbalized Sampling the simulator is prompted with its view up to a_t followed by the
VS request and generates k = 5 (reply act, probability bin) pairs (`VS_SAMPLING`, temperature 1);
`parse_verbalized` repairs them in jnp (a repeated act keeps its first probability, the stated
probabilities are renormalised) or flags them malformed (a token of the wrong kind, or no probability
mass), and a malformed turn falls back to direct sampling. Only the chosen reply enters the dialogue.
The reply distribution the agent then meets is the mean of the stated distributions over sampled
verbalizations, fallbacks included (`verbalized_table` estimates it at every decision state).

Sampling is constrained to the role's act tokens (the fixed slot of a chat template): a turn draws from
the softmax over the role's legal logits, and the behaviour log-prob is taken under that distribution.
The train step takes its log-probs under the same restricted softmax (`LossConfig.allowed_tokens`,
`AGENT_ACTS` / `REPLY_ACTS`), so the ratio is exact and no gradient moves mass to tokens the role
cannot emit. (With full-vocabulary log-probs, negative advantages pushed up to 90% of the agent's
mass onto illegal tokens within 50 steps.)

Reward
------
The reward is the game's (`personas.reward`): sigmoid(1.5 (score - 1)) of the replies the *simulator*
produced, score = #positive - #negative + 0.5 #share_personal; donation = 2 reward dollars. A dialogue
is a *success* when the persuadee gives at least $1, i.e. score >= 1 (reward >= 1/2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax import sampling
from scope_jax.envs import personas
from scope_jax.models.decoder import KVCache, Params

TURNS = personas.TURNS
N_AGENT, N_USER, N_STRATEGIES = personas.N_AGENT, personas.N_USER, personas.N_STRATEGIES
N_CARDS = len(personas.PERSONAS)

PAD = 0
GREETING = personas.GREETING + 1
AGENT0 = personas.AGENT_TOKEN0 + 1
ASK_TOKEN = AGENT0 + personas.ASK
USER0 = personas.USER_TOKEN0 + 1
CARD0 = USER0 + N_USER
NO_CARD = CARD0 + N_CARDS
VS_REQUEST = NO_CARD + 1
BIN0 = VS_REQUEST + 1
N_BINS = 11  # stated probabilities 0.0, 0.1, ..., 1.0
VOCAB_SIZE = BIN0 + N_BINS
VS_K = N_USER  # a verbalization lists every reply act once, most probable first
VS_LENGTH = 2 * VS_K
VS_SAMPLING = sampling.SamplingConfig(max_new_tokens=VS_LENGTH)  # how a simulator verbalizes

TOKEN_NAMES: tuple[str, ...] = (
    ("<pad>",) + personas.TOKENS + tuple(f"card:{p}" for p in personas.PERSONAS) + ("card:none", "<vs>")
    + tuple(f"p={b / (N_BINS - 1):.1f}" for b in range(N_BINS)))
assert len(TOKEN_NAMES) == VOCAB_SIZE

AGENT_ACTS = tuple(range(AGENT0, AGENT0 + N_AGENT))  # the agent's legal tokens
REPLY_ACTS = tuple(range(USER0, USER0 + N_USER))  # the simulator's legal tokens in a direct reply

SEQ_LEN = 2 * TURNS + 2
PROMPT_LEN = 2 * TURNS + 2  # longest VS prompt: card greeting (a u)^(TURNS-1) a_TURNS <vs>
STATE_TOKENS = np.where(personas.STATE_TOKENS == personas.PAD, PAD,
                        personas.STATE_TOKENS + 1).astype(np.int32)
STATE_LAST = (personas.STATE_LENGTH - 1).astype(np.int32)  # position of each state's last token


def card_token(persona: int | None) -> int:
    """The simulator's prompt card: a persona's card, or "no card" (the population mixture) for None."""
    return NO_CARD if persona is None else CARD0 + persona


def positions_like(tokens: jax.Array) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)


# ----------------------------------------------------------------------------------------------------
# Verbalized distributions in the token language


def verbalize(dist: np.ndarray) -> np.ndarray:
    """Reply distributions [..., N_USER] -> their verbalization [..., VS_LENGTH] token ids.

    Acts are listed by decreasing probability (ties by act index); the stated probabilities are tenths
    that sum to exactly 1 (largest-remainder rounding of 10 p).
    """
    dist = np.asarray(dist, np.float64)
    tenths = np.floor(10 * dist + 1e-9)
    remainder = 10 * dist - tenths
    missing = (10 - tenths.sum(-1)).astype(int)
    rank = np.argsort(np.argsort(-remainder, axis=-1, kind="stable"), axis=-1, kind="stable")
    tenths = tenths + (rank < missing[..., None])
    order = np.argsort(-dist, axis=-1, kind="stable")
    acts = USER0 + order
    bins = BIN0 + np.take_along_axis(tenths, order, axis=-1).astype(int)
    return np.stack([acts, bins], axis=-1).reshape(*dist.shape[:-1], VS_LENGTH).astype(np.int32)


class Verbalization(NamedTuple):
    probs: jax.Array  # [..., N_USER] the stated distribution after repair (uniform where malformed)
    malformed: jax.Array  # [...] bool: unusable, the turn falls back to direct sampling
    repaired: jax.Array  # [...] bool: usable after dropping repeated acts


def parse_verbalized(tokens: jax.Array) -> Verbalization:
    """Parse and repair generated verbalizations [..., VS_LENGTH] (pairs: reply act, probability bin)."""
    chex.assert_axis_dimension(tokens, -1, VS_LENGTH)
    acts, bins = tokens[..., 0::2] - USER0, tokens[..., 1::2] - BIN0
    well_formed = jnp.all((acts >= 0) & (acts < N_USER) & (bins >= 0) & (bins < N_BINS), axis=-1)
    one_hot = jax.nn.one_hot(acts, N_USER, dtype=jnp.float32)  # [..., K, U]; zero rows for bad acts
    earlier = jnp.cumsum(one_hot, axis=-2) - one_hot
    repeated = jnp.sum(one_hot * earlier, axis=-1) > 0  # [..., K]
    value = jnp.where(repeated, 0.0, bins.astype(jnp.float32) / (N_BINS - 1))
    mass = jnp.einsum("...k,...ku->...u", value, one_hot)
    total = mass.sum(-1)
    malformed = ~well_formed | (total <= 0)
    probs = jnp.where(malformed[..., None], 1.0 / N_USER, mass / jnp.where(malformed, 1.0, total)[..., None])
    return Verbalization(probs, malformed, ~malformed & jnp.any(repeated, axis=-1))


# ----------------------------------------------------------------------------------------------------
# Turns


def last_logits(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, index: jax.Array) -> jax.Array:
    """Logits [B, V] predicting the token after position index [B] of `tokens` [B, L] (full forward)."""
    model = nnx.merge(graphdef, params)
    hidden, _ = model.hidden(tokens, positions_like(tokens))
    return model.logits(jnp.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0])


class Draw(NamedTuple):
    act: jax.Array  # [B] act index within the role's act range
    logprob: jax.Array  # [B] log-prob of the drawn act under the distribution it was drawn from
    probs: jax.Array  # [B, n] that distribution


def act_distribution(logits: jax.Array, first: int, count: int) -> jax.Array:
    """softmax over the role's legal tokens first..first+count-1: [B, V] -> [B, count]."""
    return jax.nn.softmax(logits[:, first:first + count], axis=-1)


def draw(probs: jax.Array, key: jax.Array) -> Draw:
    """Draw one act per row of probs [B, n]."""
    logp = jnp.log(jnp.maximum(probs, 1e-30))
    act = jax.random.categorical(key, logp, axis=-1)
    return Draw(act.astype(jnp.int32), jnp.take_along_axis(logp, act[:, None], axis=-1)[:, 0], probs)


# ----------------------------------------------------------------------------------------------------
# Whole episodes on device


class Dialogues(NamedTuple):
    """B = P * M episodes; member p of the simulator population plays episodes p*M .. (p+1)*M - 1.

    tokens / agent_mask / agent_logprobs are in the agent's view [B, L]; sim_tokens / sim_mask /
    sim_logprobs in the simulators' view [P, M, L]. Per simulator turn [B, TURNS]: replied (the turn
    happened), sim_pmax (largest probability of the distribution the reply was drawn from), verbalized
    (drawn from a stated distribution), malformed / repaired (verbalization outcomes).
    """

    tokens: jax.Array
    agent_mask: jax.Array
    agent_logprobs: jax.Array
    sim_tokens: jax.Array
    sim_mask: jax.Array
    sim_logprobs: jax.Array
    rewards: jax.Array
    scores: jax.Array
    replied: jax.Array
    sim_pmax: jax.Array
    verbalized: jax.Array
    malformed: jax.Array
    repaired: jax.Array


# An agent in a rollout: (tokens [B, L] in its view, decision states [B], turn t) -> its act distribution
# [B, N_AGENT] at turn t. The decision state is `personas.state_index` of the history so far.
AgentFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def transformer_agent(graphdef: nnx.GraphDef, params: Params) -> AgentFn:
    """A transformer agent: a forward over its view, constrained to the agent's acts."""

    def act(tokens: jax.Array, states: jax.Array, t: jax.Array) -> jax.Array:
        logits = last_logits(graphdef, params, tokens, jnp.full((tokens.shape[0],), 2 * t))
        return act_distribution(logits, AGENT0, N_AGENT)

    return act


def table_agent(policies: jax.Array, per_member: int) -> AgentFn:
    """A tabular agent: policies [P, N_STATES, N_AGENT], row p playing the episodes member p answers."""
    chex.assert_shape(policies, (None, personas.N_STATES, N_AGENT))
    rows = jnp.repeat(jnp.arange(policies.shape[0]), per_member)
    return lambda tokens, states, t: policies[rows, states]


def rollout(agent_graphdef: nnx.GraphDef, agent_params: Params, sim_graphdef: nnx.GraphDef,
            sim_params: Params, cards: jax.Array, verbalized: jax.Array, key: jax.Array,
            members: int, per_member: int) -> Dialogues:
    """`play` with a transformer agent."""
    return play(transformer_agent(agent_graphdef, agent_params), sim_graphdef, sim_params, cards, verbalized,
                key, members, per_member)


def play(agent: AgentFn, sim_graphdef: nnx.GraphDef, sim_params: Params, cards: jax.Array,
         verbalized: jax.Array, key: jax.Array, members: int, per_member: int) -> Dialogues:
    """Play P * M episodes: the agent against a population of P simulators (params stacked on axis 0).

    cards [P] int: each member's prompt card. verbalized: scalar bool (not batched): simulators answer
    by Verbalized Sampling (generate k pairs with `sampling.decode` and `VS_SAMPLING`, parse, sample
    from the stated distribution; malformed -> direct). Turn t: the agent's act distribution, constrained
    draw of a_t (ASK ends the episode); simulator forward over its view, draw of u_t. After TURNS
    strategies the ASK is forced.
    """
    P, M, L, B = members, per_member, SEQ_LEN, members * per_member
    chex.assert_shape(cards, (P,))
    member_cards = jnp.repeat(cards, M)
    sim_view = lambda toks: jnp.concatenate([member_cards[:, None], toks[:, :-1]], axis=1)
    by_member = lambda x: x.reshape(P, M, *x.shape[1:])
    weights = jnp.asarray(personas.SCORE_WEIGHTS, jnp.float32)
    column = jnp.arange(L)
    put = lambda x, where, value: jnp.where(column == where, value[:, None], x)  # x[:, where] = value

    offsets = jnp.asarray(personas.LEVEL_OFFSETS, jnp.int32)

    def turn(carry, inputs):
        tokens, agent_mask, agent_logprobs, sim_mask, sim_logprobs, active, score, local = carry
        t, key = inputs
        keys = jax.random.split(key, 3)
        pos = 2 * t + 1  # the agent's act; the reply goes to pos + 1 (pos + 2 in the simulator's view)
        a = draw(agent(tokens, offsets[t] + local, t), keys[0])
        tokens = put(tokens, pos, jnp.where(active, AGENT0 + a.act, PAD))
        agent_mask = put(agent_mask, pos, active.astype(jnp.float32))
        agent_logprobs = put(agent_logprobs, pos, jnp.where(active, a.logprob, 0.0))
        active = active & (a.act != personas.ASK)

        view = by_member(sim_view(tokens))  # [P, M, L]
        sim_logits = jax.vmap(last_logits, in_axes=(None, 0, 0, None))(
            sim_graphdef, sim_params, view, jnp.full((M,), pos + 1)).reshape(B, -1)

        def stated() -> Verbalization:
            prompt = jnp.where(column < pos + 2, view, jnp.where(column == pos + 2, VS_REQUEST, PAD))
            gen = jax.vmap(sampling.decode, in_axes=(None, 0, 0, 0, 0, None))(
                sim_graphdef, sim_params, prompt[..., :PROMPT_LEN], jnp.full((P, M), pos + 3, jnp.int32),
                jax.random.split(keys[1], P), VS_SAMPLING)
            return jax.tree.map(lambda x: x.reshape(B, *x.shape[2:]), parse_verbalized(gen.tokens))

        none = Verbalization(jnp.zeros((B, N_USER)), jnp.ones((B,), bool), jnp.zeros((B,), bool))
        vs = jax.lax.cond(verbalized, stated, lambda: none)
        use_vs = verbalized & ~vs.malformed
        direct = act_distribution(sim_logits, USER0, N_USER)
        u = draw(jnp.where(use_vs[:, None], vs.probs, direct), keys[2])
        tokens = put(tokens, pos + 1, jnp.where(active, USER0 + u.act, PAD))
        sim_mask = put(sim_mask, pos + 2, active.astype(jnp.float32))
        sim_logprobs = put(sim_logprobs, pos + 2, jnp.where(active, u.logprob, 0.0))
        score = score + jnp.where(active, weights[u.act], 0.0)
        local = jnp.where(active, local * personas.BRANCH + a.act * N_USER + u.act, local)  # ended: any state
        stats = dict(replied=active, sim_pmax=u.probs.max(-1), verbalized=active & use_vs,
                     malformed=active & verbalized & vs.malformed, repaired=active & use_vs & vs.repaired)
        return (tokens, agent_mask, agent_logprobs, sim_mask, sim_logprobs, active, score, local), stats

    zeros = jnp.zeros((B, L), jnp.float32)
    carry = (jnp.full((B, L), PAD, jnp.int32).at[:, 0].set(GREETING), zeros, zeros, zeros, zeros,
             jnp.ones((B,), bool), jnp.zeros((B,), jnp.float32), jnp.zeros((B,), jnp.int32))
    carry, stats = jax.lax.scan(turn, carry, (jnp.arange(TURNS), jax.random.split(key, TURNS)))
    tokens, agent_mask, agent_logprobs, sim_mask, sim_logprobs, active, score, _ = carry
    # The donation request closes every dialogue: forced after the last strategy (not a decision).
    tokens = tokens.at[:, L - 1].set(jnp.where(active, ASK_TOKEN, tokens[:, L - 1]))
    rewards = jax.nn.sigmoid(personas.REWARD_SLOPE * (score - personas.REWARD_MIDPOINT))
    stats = {k: v.swapaxes(0, 1) for k, v in stats.items()}
    return Dialogues(tokens, agent_mask, agent_logprobs, by_member(sim_view(tokens)), by_member(sim_mask),
                     by_member(sim_logprobs), rewards, score, **stats)


# ----------------------------------------------------------------------------------------------------
# Exact evaluation: a transformer player read out at every decision state


def agent_policy_table(graphdef: nnx.GraphDef, params: Params) -> jax.Array:
    """pi[i, a] [N_STATES, N_AGENT]: the agent's constrained act distribution at every decision state.

    Level by level down the game tree: a state of level t is its parent's history followed by (a_t, u_t),
    so each level runs only those two tokens per state, over a copy of its parent's KV cache. That is 2
    tokens per state instead of its whole history (half the work of one forward over `STATE_TOKENS`,
    and of the backward pass through it in `testbed.gradients`).
    """
    model = nnx.merge(graphdef, params)
    greeting = jnp.full((1, 1), GREETING, jnp.int32)
    hidden, cache = model.hidden(greeting, jnp.zeros((1, 1), jnp.int32), KVCache.zeros(model.config, 1, 1))
    last = [hidden[:, -1]]
    # The children of a parent are consecutive: each child starts from its parent's cache, 2 slots longer.
    grow = lambda x: jnp.pad(jnp.repeat(x, personas.BRANCH, axis=1), ((0, 0),) * 3 + ((0, 2), (0, 0)))
    for t in range(1, personas.TURNS):
        level = slice(personas.LEVEL_OFFSETS[t], personas.LEVEL_OFFSETS[t + 1])
        tokens = jnp.asarray(STATE_TOKENS[level, 2 * t - 1:2 * t + 1])  # a_t u_t
        hidden, cache = model.hidden(tokens, jnp.broadcast_to(jnp.arange(2 * t - 1, 2 * t + 1), tokens.shape),
                                     KVCache(*map(grow, cache)))
        last.append(hidden[:, -1])
    return act_distribution(model.logits(jnp.concatenate(last)), AGENT0, N_AGENT)


def _state_prefix_cache(graphdef: nnx.GraphDef, params: Params, card: jax.Array, extra: int):
    """The model over (card, state tokens) for every decision state, with a KV cache of `extra` free slots."""
    model = nnx.merge(graphdef, params)
    prefix = jnp.concatenate([jnp.full((personas.N_STATES, 1), card, jnp.int32),
                              jnp.asarray(STATE_TOKENS)], 1)
    cache = KVCache.zeros(model.config, personas.N_STATES, prefix.shape[1] + extra)
    _, cache = model.hidden(prefix, positions_like(prefix), cache)
    return model, cache


def sim_reply_table(graphdef: nnx.GraphDef, params: Params, card: jax.Array) -> jax.Array:
    """q[i, s, u] [N_STATES, N_STRATEGIES, N_USER]: the simulator's constrained reply distribution.

    The prefix (card, history) of every state is run once into a KV cache; each strategy is then one
    cached step at position 1 + len(history) (its cache write overwrites only padding, see decoder.py).
    """
    model, cache = _state_prefix_cache(graphdef, params, card, 1)
    position = jnp.asarray(STATE_LAST + 2)[:, None]

    def reply(strategy):
        hidden, _ = model.hidden(jnp.full_like(position, AGENT0 + strategy), position, cache)
        return act_distribution(model.logits(hidden[:, 0]), USER0, N_USER)

    return jax.vmap(reply, out_axes=1)(jnp.arange(N_STRATEGIES))


def best_response(q: jax.Array) -> jax.Array:
    """pi* [..., N_STATES, N_AGENT] (one-hot): the exact best response to reply tables
    q [..., N_STATES, S, U], by `personas.best_response` (float64 backward induction) on the host,
    through `jax.pure_callback`."""
    chex.assert_shape(q, (..., personas.N_STATES, N_STRATEGIES, N_USER))
    lead = q.shape[:-3]

    def host(q: np.ndarray) -> np.ndarray:
        flat = np.asarray(q).reshape(-1, *q.shape[-3:])
        policies = np.stack([personas.best_response(as_table(table)).policy for table in flat])
        return policies.reshape(*q.shape[:-3], personas.N_STATES, N_AGENT).astype(np.float32)

    out = jax.ShapeDtypeStruct((*lead, personas.N_STATES, N_AGENT), jnp.float32)
    return jax.pure_callback(host, out, q, vmap_method="broadcast_all")


def _verbalization_prompts(card: jax.Array, states: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """VS prompts (card, history, strategy, <vs>) for every strategy at `states` [n], as in a rollout:
    (prompts [n * S, PROMPT_LEN], prompt lengths [n * S])."""
    n = len(states)
    prefix = jnp.concatenate([jnp.full((n, 1), card, jnp.int32), jnp.asarray(STATE_TOKENS[states])], 1)
    prompts = jnp.broadcast_to(jnp.pad(prefix, ((0, 0), (0, 2)))[:, None],
                               (n, N_STRATEGIES, PROMPT_LEN)).reshape(-1, PROMPT_LEN)
    rows = jnp.arange(prompts.shape[0])
    where = jnp.repeat(jnp.asarray(STATE_LAST[states] + 2), N_STRATEGIES)  # the strategy's position
    prompts = prompts.at[rows, where].set(AGENT0 + jnp.tile(jnp.arange(N_STRATEGIES), n))
    return prompts.at[rows, where + 1].set(VS_REQUEST), where + 2


def verbalized_replies(graphdef: nnx.GraphDef, params: Params, card: jax.Array, direct: jax.Array,
                       states: np.ndarray, key: jax.Array, samples: int) -> tuple[jax.Array, jax.Array]:
    """The reply distribution of a Verbalized Sampling simulator at `states` [n] (every strategy):
    the mean over `samples` verbalizations drawn as in a rollout (`VS_SAMPLING`) of the stated
    distribution, a malformed one replaced by `direct` [n, S, U] (the direct reply distribution).
    Returns (q [n, S, U], malformed fraction [n, S]); q is an unbiased estimate of what the agent meets.
    """
    prompts, lengths = _verbalization_prompts(card, states)

    def one(key):
        gen = sampling.decode(graphdef, params, prompts, lengths, key, VS_SAMPLING)
        parsed = jax.tree.map(lambda x: x.reshape(len(states), N_STRATEGIES, *x.shape[1:]),
                              parse_verbalized(gen.tokens))
        return jnp.where(parsed.malformed[..., None], direct, parsed.probs), parsed.malformed

    q, malformed = jax.lax.map(one, jax.random.split(key, samples))
    return q.mean(0), malformed.mean(0)


def verbalized_table(graphdef: nnx.GraphDef, params: Params, card: jax.Array, key: jax.Array,
                     samples: int) -> tuple[jax.Array, jax.Array]:
    """`verbalized_replies` at every decision state: (q [N_STATES, S, U], malformed fraction [N_STATES, S])
    (`samples` static under jit)."""
    direct = sim_reply_table(graphdef, params, card)
    return verbalized_replies(graphdef, params, card, direct, np.arange(personas.N_STATES), key, samples)


def as_table(probs: np.ndarray) -> np.ndarray:
    """float32 device probabilities -> float64 rows that sum to 1 (what `personas` checks)."""
    probs = np.asarray(probs, np.float64)
    return probs / probs.sum(-1, keepdims=True)
