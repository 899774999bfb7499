"""Pretraining the testbed's transformers by supervised learning (`SFT`, one jitted step, model by model).

* Agent: persuader behaviour, i.e. dialogues of the P4G policy (`personas.p4g_policy`: per-turn P4G
  strategy frequencies, the donation request only when forced) with the population; loss on its acts.
* Simulators: population dialogues (persona ~ prior, strategies uniform so that every context is seen),
  loss on the replies (cross-entropy to the distribution each reply was drawn from, see `SFT`). The
  prompt shows the persona's card with probability `card_prob`, else "no card", so one model answers
  as a given persona and as the population mixture (its posterior predictive). The base simulator
  uses the population prior; the held-out simulators their own init/data seeds and persona mixtures.
* Alignment-like step, which makes the aligned simulator: fine-tune the base simulator on
  (a) self-distillation with an agreeableness pull: its own reply distribution as one persona (the
      card shown), at temperature T < 1 with negative replies turned into positive ones, becomes the
      target of its *no-card* replies: the direct replies collapse onto an agreeable mode;
  (b) instruction following for Verbalized Sampling: after (no card, history, strategy, <vs>) state
      the posterior predictive of its pretraining population, `personas.base_simulator()`, as k = 5
      (act, tenth) pairs. What the model states is what its pretraining data say about users, while
      what it answers directly is the aligned mode. (Taught here, not in pretraining: in a model this
      small, verbalization examples in pretraining cost the direct replies half their fidelity.)

Data are drawn on the host with numpy (exact game tables, per-dialogue histories).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from scope_jax.envs import personas
from scope_jax.envs import persona_lm as lm
from scope_jax.logprobs import token_logprobs
from scope_jax.models import decoder
from scope_jax.models.decoder import Params
from scope_jax.models.tiny import tiny_config
from scope_jax.training.state import stack_population

PERSONA_TABLES = np.stack([personas.persona_simulator(p) for p in range(len(personas.PERSONAS))])
UNIFORM = np.full(personas.N_STRATEGIES, 1.0 / personas.N_STRATEGIES)
AGENT_POSITIONS = np.arange(1, lm.SEQ_LEN, 2)  # a_1 .. a_T and the final ASK in the agent's view
REPLY_POSITIONS = np.arange(3, lm.SEQ_LEN, 2)  # u_1 .. u_T in the simulator's view


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Sizes and schedules of supervised pretraining."""

    hidden_size: int = 32
    num_layers: int = 3
    batch: int = 256
    vs_batch: int = 64
    learning_rate: float = 1e-2
    agent_steps: int = 120
    sim_steps: int = 300
    collapse_steps: int = 200
    card_prob: float = 0.5
    collapse_temperature: float = 0.5
    heldout_priors: tuple[tuple[float, ...], ...] = ((0.2, 0.3, 0.25, 0.25), (0.25, 0.25, 0.25, 0.25))


def model_config(config: PretrainConfig):
    return tiny_config(lm.VOCAB_SIZE, hidden_size=config.hidden_size, num_layers=config.num_layers)


def init_model(config: PretrainConfig, seed: int) -> Params:
    """A freshly initialised decoder's params."""
    return decoder.init(model_config(config), seed=int(seed))[1]


# ----------------------------------------------------------------------------------------------------
# Host-side data


class Dialogues(NamedTuple):
    strategies: np.ndarray  # [n, TURNS]
    replies: np.ndarray  # [n, TURNS]
    states: np.ndarray  # [n, TURNS] decision state before each strategy


def sample_categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of probs [n, k]."""
    return np.minimum((rng.random(len(probs))[:, None] > np.cumsum(probs, -1)).sum(-1), probs.shape[-1] - 1)


def sample_dialogues(rng: np.random.Generator, n: int, strategy_probs: np.ndarray, tables: np.ndarray,
                     which: np.ndarray) -> Dialogues:
    """n full-length dialogues: strategies ~ strategy_probs [S], replies ~ tables[which[d], state, s].

    tables [K, N_STATES, S, U] (e.g. one persona per k), which [n] in 0..K-1.
    """
    chex.assert_shape(tables, (None, personas.N_STATES, personas.N_STRATEGIES, personas.N_USER))
    strategies = rng.choice(personas.N_STRATEGIES, size=(n, personas.TURNS), p=strategy_probs)
    replies = np.empty_like(strategies)
    states = np.empty_like(strategies)
    state = np.zeros(n, dtype=np.int64)
    for t in range(personas.TURNS):
        states[:, t] = state
        s = strategies[:, t]
        replies[:, t] = sample_categorical(rng, tables[which, state, s])
        local = (state - personas.LEVEL_OFFSETS[t]) * personas.BRANCH + s * personas.N_USER + replies[:, t]
        state = personas.LEVEL_OFFSETS[t + 1] + local
    return Dialogues(strategies, replies, states)


def agent_view(d: Dialogues) -> np.ndarray:
    """[n, SEQ_LEN]: greeting a1 u1 .. aT uT ASK."""
    pairs = np.stack([lm.AGENT0 + d.strategies, lm.USER0 + d.replies], -1).reshape(len(d.strategies), -1)
    n = len(pairs)
    return np.concatenate([np.full((n, 1), lm.GREETING), pairs, np.full((n, 1), lm.ASK_TOKEN)],
                          1).astype(np.int32)


def sim_view(d: Dialogues, cards: np.ndarray) -> np.ndarray:
    """[n, SEQ_LEN]: card greeting a1 u1 .. aT uT."""
    return np.concatenate([cards[:, None], agent_view(d)[:, :-1]], 1).astype(np.int32)


def position_mask(n: int, length: int, positions: np.ndarray) -> np.ndarray:
    mask = np.zeros((n, length), np.float32)
    mask[:, positions] = 1.0
    return mask


def verbalization_examples(rng: np.random.Generator, d: Dialogues, predictive: np.ndarray,
                           n: int) -> tuple[np.ndarray, np.ndarray]:
    """n VS examples from the first n dialogues at a random turn: (tokens, mask) [n, PROMPT_LEN + VS_LENGTH].

    no-card greeting (a u)^t a_t <vs> | verbalize(predictive[state_t, a_t]); loss on the verbalization.
    """
    t = rng.integers(0, personas.TURNS, n)
    rows = np.arange(n)
    view = sim_view(Dialogues(*(x[:n] for x in d)), np.full(n, lm.NO_CARD))
    length = lm.PROMPT_LEN + lm.VS_LENGTH
    tokens = np.zeros((n, length), np.int32)
    prompt_len = 2 * t + 4  # card greeting (a u)^t a_t <vs>
    keep = np.arange(lm.SEQ_LEN) < (prompt_len - 1)[:, None]
    tokens[:, :lm.SEQ_LEN] = np.where(keep, view, lm.PAD)
    tokens[rows, prompt_len - 1] = lm.VS_REQUEST
    target = lm.verbalize(predictive[d.states[rows, t], d.strategies[rows, t]])
    cols = prompt_len[:, None] + np.arange(lm.VS_LENGTH)
    tokens[rows[:, None], cols] = target
    mask = np.zeros((n, length), np.float32)
    mask[rows[:, None], cols] = 1.0
    return tokens, mask


# ----------------------------------------------------------------------------------------------------
# Supervised fine-tuning on device

# tokens [S, B, L] int32 with either a loss mask [S, B, L] (imitate those tokens) or reply targets
# [S, B, L, N_USER] (match that distribution over the reply acts at each position; zero rows elsewhere).
Dataset = tuple[np.ndarray, np.ndarray]


def reply_targets(d: Dialogues, tables: np.ndarray, which: np.ndarray) -> np.ndarray:
    """[n, SEQ_LEN, N_USER]: at each reply position of the simulator's view, the distribution the reply
    was drawn from, tables[which, state, strategy] (zero rows elsewhere)."""
    targets = np.zeros((len(which), lm.SEQ_LEN, personas.N_USER), np.float32)
    targets[:, REPLY_POSITIONS] = tables[which[:, None], d.states, d.strategies]
    return targets


class SFT:
    """Supervised fine-tuning of one model at a time: Adam steps on the mean token cross-entropy.

    Each step minimises the sum over datasets of the mean cross-entropy per target token: with a mask,
    -sum(mask log p(token)) / sum(mask) through `token_logprobs` (the loss path of RL training); with
    reply targets q, -sum_t sum_u q_t(u) log p(u | tokens_<t) / #targets. The second is the first's
    expectation over the sampled replies given the dialogue so far (Rao-Blackwellised: the same
    expected gradient, without the sampling noise, which a tiny model trained for a few hundred steps
    otherwise keeps). The learning rate decays as a cosine to 0 over the
    run (the targets are samples; a decayed rate averages their noise out); it is an argument of the
    one jitted step, so runs of any length and models of any seed share one compiled program per
    dataset layout.
    """

    def __init__(self, graphdef: nnx.GraphDef, learning_rate: float):
        self.learning_rate = learning_rate
        self.adam = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam())

        def nll(params, batch):
            tokens, target = batch
            if target.ndim == tokens.ndim:
                logprobs = token_logprobs(graphdef, params, tokens, lm.positions_like(tokens)).logprobs
                return -jnp.sum(logprobs * target) / jnp.maximum(jnp.sum(target), 1.0)
            model = nnx.merge(graphdef, params)
            hidden, _ = model.hidden(tokens, lm.positions_like(tokens))
            logp = jax.nn.log_softmax(model.logits(hidden[:, :-1]))[..., lm.USER0:lm.USER0 + personas.N_USER]
            return -jnp.sum(target[:, 1:] * logp) / jnp.maximum(jnp.sum(target), 1.0)

        def step(params, opt_state, batches, lr):
            loss, grads = jax.value_and_grad(lambda p: sum(nll(p, b) for b in batches))(params)
            updates, opt_state = self.adam.update(grads, opt_state, params)
            return jax.tree.map(lambda p, u: p - lr * u, params, updates), opt_state, loss

        self.step = jax.jit(step, donate_argnums=(0, 1))

    def __call__(self, params: Params, datasets: tuple[Dataset, ...]) -> tuple[Params, float]:
        """Train on datasets (tokens [S, B, L], mask [S, B, L]), one batch of each per step;
        returns (params, last loss)."""
        steps = len(datasets[0][0])
        opt_state = self.adam.init(params)
        loss = jnp.nan
        for i in range(steps):
            lr = self.learning_rate * 0.5 * (1.0 + np.cos(np.pi * i / steps))
            params, opt_state, loss = self.step(params, opt_state,
                                                tuple((t[i], m[i]) for t, m in datasets), lr)
        return params, float(loss)

    def many(self, inits: Sequence[Params],
             datasets: Sequence[tuple[Dataset, ...]]) -> tuple[Params, np.ndarray]:
        """Train each model on its datasets; (params stacked on axis 0, last losses)."""
        trained = [self(p, d) for p, d in zip(inits, datasets)]
        return stack_population([p for p, _ in trained]), np.array([loss for _, loss in trained])


# ----------------------------------------------------------------------------------------------------
# The pretraining pipeline


class Pretrained(NamedTuple):
    """Every model; per-seed ones stacked on a leading seed axis R."""

    agent: Params  # [R]
    base: Params  # [R] the base simulator (population prior)
    collapsed: Params  # [R, C] collapsed simulators, one per collapse persona
    heldout: Params  # [H] independently trained simulators (own seeds and priors), shared by all seeds
    losses: dict[str, np.ndarray]  # final SFT loss of every model


def _batches(x: np.ndarray, steps: int) -> np.ndarray:
    return x.reshape(steps, -1, *x.shape[1:])


def simulator_data(config: PretrainConfig, seed: Sequence[int], prior: Sequence[float]) -> tuple[Dataset]:
    """Direct replies to population dialogues (card shown with probability card_prob), batched per step."""
    prior = np.asarray(prior, np.float64) / np.sum(prior)
    rng = np.random.default_rng(seed)
    steps, n = config.sim_steps, config.sim_steps * config.batch
    persona = rng.choice(len(personas.PERSONAS), n, p=prior)
    d = sample_dialogues(rng, n, UNIFORM, PERSONA_TABLES, persona)
    cards = np.where(rng.random(n) < config.card_prob, lm.CARD0 + persona, lm.NO_CARD)
    return ((_batches(sim_view(d, cards), steps),
             _batches(reply_targets(d, PERSONA_TABLES, persona), steps)),)


def pretrain(config: PretrainConfig, seeds: Sequence[int], collapse_personas: Sequence[int],
             heldout_seeds: Sequence[int]) -> Pretrained:
    """Agent, base and collapsed simulators for every seed; the held-out simulators once."""
    graphdef, _ = decoder.init(model_config(config), seed=0)
    sft = SFT(graphdef, config.learning_rate)
    B, R, C = config.batch, len(seeds), len(collapse_personas)
    p4g = personas.p4g_policy()[0, :personas.N_STRATEGIES]

    agent_data = []
    for seed in seeds:
        rng = np.random.default_rng([seed, 0])
        n = config.agent_steps * B
        d = sample_dialogues(rng, n, p4g, PERSONA_TABLES,
                             rng.choice(len(personas.PERSONAS), n, p=personas.PRIOR))
        agent_data.append(((_batches(agent_view(d), config.agent_steps),
                            _batches(position_mask(n, lm.SEQ_LEN, AGENT_POSITIONS), config.agent_steps)),))
    agent, agent_losses = sft.many([init_model(config, 1000 * s) for s in seeds], agent_data)

    priors = [personas.PRIOR] * R + list(config.heldout_priors)
    data_seeds = [[s, 1] for s in seeds] + [[s, 2] for s in heldout_seeds]
    init_seeds = [1000 * s + 1 for s in seeds] + [1000 * s + 2 for s in heldout_seeds]
    sims, sim_losses = sft.many([init_model(config, s) for s in init_seeds],
                                [simulator_data(config, ds, prior) for ds, prior in zip(data_seeds, priors)])
    base = jax.tree.map(lambda x: x[:R], sims)
    heldout = jax.tree.map(lambda x: x[R:], sims)

    # Alignment-like step: self-distilled, agreeable, low-temperature persona replies become the no-card
    # replies, and the model learns to answer the VS request with its pretraining population's predictive.
    tabulate = jax.jit(lm.sim_reply_table, static_argnums=0)
    card_tables = [[np.asarray(tabulate(graphdef, jax.tree.map(lambda x: x[r], base), lm.card_token(p)),
                               np.float64)
                    for p in collapse_personas] for r in range(R)]
    collapse_data = []
    steps, n, n_vs = config.collapse_steps, config.collapse_steps * B, config.collapse_steps * config.vs_batch
    for r, seed in enumerate(seeds):
        for c, persona in enumerate(collapse_personas):
            rng = np.random.default_rng([seed, 3, persona])
            target = personas.agreeable_sharpened(card_tables[r][c], config.collapse_temperature)
            d = sample_dialogues(rng, n, UNIFORM, target[None], np.zeros(n, np.int64))
            population = sample_dialogues(rng, n_vs, UNIFORM, PERSONA_TABLES,
                                          rng.choice(len(personas.PERSONAS), n_vs, p=personas.PRIOR))
            vs = verbalization_examples(rng, population, personas.base_simulator(), n_vs)
            collapse_data.append(((_batches(sim_view(d, np.full(n, lm.NO_CARD)), steps),
                                   _batches(reply_targets(d, target[None], np.zeros(n, np.int64)), steps)),
                                  tuple(_batches(x, steps) for x in vs)))
    collapse_init = [jax.tree.map(lambda x: x[r], base) for r in range(R) for _ in range(C)]
    collapsed, collapse_losses = sft.many(collapse_init, collapse_data)
    collapsed = jax.tree.map(lambda x: x.reshape(R, C, *x.shape[1:]), collapsed)

    return Pretrained(agent, base, collapsed, heldout,
                      {"agent": agent_losses, "base": sim_losses[:R], "heldout": sim_losses[R:],
                       "collapse": collapse_losses.reshape(R, C)})
