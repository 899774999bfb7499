"""Pretraining the testbed's transformers by supervised learning (`SFT`: one jitted step vmapped over models).

* Agent: persuader behaviour, i.e. dialogues of the P4G policy (`personas.p4g_policy`: per-turn P4G
  strategy frequencies, the donation request only when forced) with the population; loss on its acts.
* Simulators: population dialogues (persona ~ prior, strategies uniform so that every context is seen),
  loss on the replies (cross-entropy to the distribution each reply was drawn from, see `SFT`). The
  prompt shows the persona's card with probability `card_prob`, else "no card", so one model answers
  as a given persona and as the population mixture (its posterior predictive). The base simulator
  uses the population prior; the held-out simulators their own init/data seeds and persona mixtures.
* Alignment-like step, which makes the aligned simulators (one per collapse persona): fine-tune the
  base simulator on
  (a) self-distillation with an agreeableness pull: its own reply distribution as one persona (the
      card shown), at temperature T < 1 with negative replies turned into positive ones, becomes the
      target of its *no-card* replies: the direct replies collapse onto an agreeable mode;
  (b) instruction following for Verbalized Sampling: after (no card, history, strategy, <vs>) state
      the base model's own no-card reply distribution (read out from the transformer before this
      step) as k = 5 (act, tenth) pairs. What the aligned model states is what it knew before
      alignment, never the game's tables; what it answers directly is the aligned mode. (Taught here,
      not in pretraining: in a model this small, verbalization examples in pretraining cost the
      direct replies half their fidelity.)
* Self-play's joint model: the emotional collapsed simulator, taught the agent's role on the agent's
  data while it keeps its collapsed no-card replies (its own alignment target), so one transformer
  knows both roles (the simulator's view starts with the card slot, which the agent's never holds)
  and its user role starts where Co-Training's simulator starts.

Data are drawn on the host with numpy (exact game tables, per-dialogue histories).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from scope_jax.testbed.progress import Ticker
from scope_jax.training.state import leaves_at, stack_population

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
    sim_steps: int = 240
    collapse_steps: int = 80
    selfplay_steps: int = 60
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
# [S, B, L, N_USER] (match that distribution over the reply acts at each position; zero rows elsewhere);
# `SFT` takes them with a leading model axis K.
Dataset = tuple[np.ndarray, np.ndarray]


def reply_targets(d: Dialogues, tables: np.ndarray, which: np.ndarray) -> np.ndarray:
    """[n, SEQ_LEN, N_USER]: at each reply position of the simulator's view, the distribution the reply
    was drawn from, tables[which, state, strategy] (zero rows elsewhere)."""
    targets = np.zeros((len(which), lm.SEQ_LEN, personas.N_USER), np.float32)
    targets[:, REPLY_POSITIONS] = tables[which[:, None], d.states, d.strategies]
    return targets


class SFT:
    """Supervised fine-tuning of K models at once: Adam steps on the mean token cross-entropy, one
    jitted step vmapped over the models.

    Each step minimises the sum over datasets of the mean cross-entropy per target token: with a mask,
    -sum(mask log p(token)) / sum(mask) through `token_logprobs` (the loss path of RL training); with
    reply targets q, -sum_t sum_u q_t(u) log p(u | tokens_<t) / #targets. The second is the first's
    expectation over the sampled replies given the dialogue so far (Rao-Blackwellised: the same
    expected gradient, without the sampling noise, which a tiny model trained for a few hundred steps
    otherwise keeps). The learning rate decays as a cosine to 0 over the run (the targets are
    samples; a decayed rate averages their noise out); it is an argument of the one jitted step, so
    runs of any length share one compiled program per dataset layout and number of models.
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

        self.step = jax.jit(jax.vmap(step, in_axes=(0, 0, 0, None)), donate_argnums=(0, 1))

    def __call__(self, params: Params, datasets: Sequence[Dataset], label: str = "SFT",
                 say: Callable[[str], None] = print) -> tuple[Params, np.ndarray]:
        """Train models params [K] on datasets (tokens [K, S, B, L], targets [K, S, B, ...]), one batch
        of each per step; returns (params [K], last losses [K]). Progress lines go to `say`."""
        steps = datasets[0][0].shape[1]
        ticker = Ticker(label, steps, say)
        opt_state = jax.vmap(self.adam.init)(params)
        loss = jnp.full(jax.tree.leaves(params)[0].shape[:1], jnp.nan)
        for i in range(steps):
            lr = self.learning_rate * 0.5 * (1.0 + np.cos(np.pi * i / steps))
            params, opt_state, loss = self.step(params, opt_state,
                                                tuple((t[:, i], m[:, i]) for t, m in datasets), lr)
            ticker(i + 1)
        return params, np.asarray(loss)


# ----------------------------------------------------------------------------------------------------
# The pretraining pipeline


class Pretrained(NamedTuple):
    """Every model; per-seed ones stacked on a leading seed axis R."""

    agent: Params  # [R]
    base: Params  # [R] the base simulator (population prior)
    collapsed: Params  # [R, C] collapsed simulators, one per collapse persona (C = 0: the emotional one)
    heldout: Params  # [H] independently trained simulators (own seeds and priors), shared by all seeds
    selfplay: Params | None  # [R] the joint model of both roles, aligned (None when no arm plays itself)
    losses: dict[str, np.ndarray]  # final SFT loss of every model


def _batches(x: np.ndarray, steps: int) -> np.ndarray:
    return x.reshape(steps, -1, *x.shape[1:])


def _stack(datasets: Sequence[tuple[Dataset, ...]]) -> tuple[Dataset, ...]:
    """One tuple of datasets per model -> the same tuple with a leading model axis K."""
    return tuple((np.stack([d[k][0] for d in datasets]), np.stack([d[k][1] for d in datasets]))
                 for k in range(len(datasets[0])))


def _inits(config: PretrainConfig, seeds: Sequence[int]) -> Params:
    return stack_population([init_model(config, s) for s in seeds])


def agent_data(config: PretrainConfig, seed: Sequence[int], steps: int) -> Dataset:
    """Population dialogues of the P4G policy, loss on the agent's acts, batched per step."""
    rng = np.random.default_rng(seed)
    n = steps * config.batch
    p4g = personas.p4g_policy()[0, :personas.N_STRATEGIES]
    d = sample_dialogues(rng, n, p4g, PERSONA_TABLES, rng.choice(len(personas.PERSONAS), n, p=personas.PRIOR))
    return _batches(agent_view(d), steps), _batches(position_mask(n, lm.SEQ_LEN, AGENT_POSITIONS), steps)


def simulator_data(config: PretrainConfig, seed: Sequence[int], prior: Sequence[float]) -> Dataset:
    """Direct replies to population dialogues (card shown with probability card_prob), batched per step."""
    prior = np.asarray(prior, np.float64) / np.sum(prior)
    rng = np.random.default_rng(seed)
    steps, n = config.sim_steps, config.sim_steps * config.batch
    persona = rng.choice(len(personas.PERSONAS), n, p=prior)
    d = sample_dialogues(rng, n, UNIFORM, PERSONA_TABLES, persona)
    cards = np.where(rng.random(n) < config.card_prob, lm.CARD0 + persona, lm.NO_CARD)
    return _batches(sim_view(d, cards), steps), _batches(reply_targets(d, PERSONA_TABLES, persona), steps)


def collapse_data(config: PretrainConfig, seed: Sequence[int], card_table: np.ndarray, steps: int) -> Dataset:
    """The alignment-like target: no-card replies = the agreeable, sharpened card replies, per step."""
    rng = np.random.default_rng(seed)
    n = steps * config.batch
    target = personas.agreeable_sharpened(card_table, config.collapse_temperature)
    d = sample_dialogues(rng, n, UNIFORM, target[None], np.zeros(n, np.int64))
    return (_batches(sim_view(d, np.full(n, lm.NO_CARD)), steps),
            _batches(reply_targets(d, target[None], np.zeros(n, np.int64)), steps))


def verbalization_data(config: PretrainConfig, seed: Sequence[int], predictive: np.ndarray) -> Dataset:
    """VS instruction following on population dialogues: state `predictive` [N_STATES, S, U], per step."""
    rng = np.random.default_rng(seed)
    n = config.collapse_steps * config.vs_batch
    population = sample_dialogues(rng, n, UNIFORM, PERSONA_TABLES,
                                  rng.choice(len(personas.PERSONAS), n, p=personas.PRIOR))
    examples = verbalization_examples(rng, population, predictive, n)
    return tuple(_batches(x, config.collapse_steps) for x in examples)


def pretrain(config: PretrainConfig, seeds: Sequence[int], collapse_personas: Sequence[int],
             heldout_seeds: Sequence[int], selfplay: bool = False,
             say: Callable[[str], None] = lambda message: None) -> Pretrained:
    """Agent, base and collapsed simulators (and the joint model) for every seed; the held-out
    simulators once. Each phase's progress lines go to `say`."""
    graphdef, _ = decoder.init(model_config(config), seed=0)
    sft = SFT(graphdef, config.learning_rate)
    R, C = len(seeds), len(collapse_personas)

    # The agent's SFT runs on a second thread beside the simulators' chain (XLA:CPU runs these tiny
    # programs on about one core each); the models do not depend on it.
    pool = ThreadPoolExecutor(1)
    agent_job = pool.submit(sft, _inits(config, [1000 * s for s in seeds]),
                            _stack([(agent_data(config, [s, 0], config.agent_steps),) for s in seeds]),
                            f"pretraining {R} agents (persuader dialogues)", say)

    priors = [personas.PRIOR] * R + list(config.heldout_priors)
    data_seeds = [[s, 1] for s in seeds] + [[s, 2] for s in heldout_seeds]
    init_seeds = [1000 * s + 1 for s in seeds] + [1000 * s + 2 for s in heldout_seeds]
    sim_data = [(simulator_data(config, ds, prior),) for ds, prior in zip(data_seeds, priors)]
    sims, sim_losses = sft(_inits(config, init_seeds), _stack(sim_data),
                           f"pretraining {len(init_seeds)} simulators (population dialogues)", say)
    base = jax.tree.map(lambda x: x[:R], sims)
    heldout = jax.tree.map(lambda x: x[R:], sims)

    # Alignment-like step: self-distilled, agreeable, low-temperature persona replies become the no-card
    # replies, and the model learns to state its own pre-alignment no-card replies when asked to verbalize.
    tabulate = jax.jit(lm.sim_reply_table, static_argnums=0)
    read = lambda params, card: np.asarray(tabulate(graphdef, params, card), np.float64)
    card_tables = [{p: read(leaves_at(base, r), lm.card_token(p)) for p in collapse_personas}
                   for r in range(R)]
    datasets = []
    for r, seed in enumerate(seeds):
        vs = verbalization_data(config, [seed, 3], read(leaves_at(base, r), lm.NO_CARD))
        datasets += [(collapse_data(config, [seed, 3, p], card_tables[r][p], config.collapse_steps), vs)
                     for p in collapse_personas]
    collapsed, collapse_losses = sft(jax.tree.map(lambda x: jnp.repeat(x, C, axis=0), base), _stack(datasets),
                                     f"collapsing {R * C} simulators (alignment-like step)", say)
    collapsed = jax.tree.map(lambda x: x.reshape(R, C, *x.shape[1:]), collapsed)
    agent, agent_losses = agent_job.result()
    pool.shutdown()
    losses = {"agent": agent_losses, "base": sim_losses[:R], "heldout": sim_losses[R:],
              "collapse": collapse_losses.reshape(R, C)}

    joint = None
    if selfplay:
        emotional = collapse_personas.index(personas.EMOTIONAL)
        steps = config.selfplay_steps
        both_roles = [(agent_data(config, [s, 4], steps),
                       collapse_data(config, [s, 5], card_tables[r][personas.EMOTIONAL], steps))
                      for r, s in enumerate(seeds)]
        joint, losses["selfplay"] = sft(jax.tree.map(lambda x: x[:, emotional], collapsed),
                                        _stack(both_roles), f"teaching {R} self-play models both roles", say)
    return Pretrained(agent, base, collapsed, heldout, joint, losses)
