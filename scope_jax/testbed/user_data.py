"""User data: dialogues of the population, the one thing a simulator can learn the users from.

The dialogues are played by the untrained agent (the P4G strategy frequencies the agent is pretrained
to imitate, `personas.p4g_policy`) against the base simulator (the population's posterior predictive:
the game's ground truth), drawn on the host from one data seed that no run seed touches. The first n
of the `DataConfig.max_dialogues` drawn serve every arm at size n, so the sizes are nested. The last
tenth (at least one dialogue) of each size is held out: the simulators are fitted on the rest, and the
held-out part measures their NLL (early stopping of the fit, the data anchor's weight rule).

`reply_estimate` is what Verbalized Sampling is taught to state: the data's reply frequencies at each
(state, strategy), smoothed towards the frequencies pooled over states for that strategy.

For scarce data (issue 33): `bootstrap` resamples a population member's dialogues, `temper` sets a
reply table's softmax temperature and `calibrate` picks it on the held-out dialogues (`TEMPERATURES`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed.pretrain import REPLY_POSITIONS, Dialogues, sample_dialogues, sim_view
from scope_jax.training.batch import TokenBatch


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """sizes: the numbers of dialogues N the arms see; seed: the data seed (apart from the run seeds).
    fit_steps x fit_batch / fit_learning_rate: Adam steps of the fits on rows drawn with replacement
    (early-stopped on the held-out tenth every `check_every` steps). smoothing: the prior weight (in dialogues) of the pooled
    frequencies in `reply_estimate`. vs_steps x vs_batch: the Verbalized Sampling teaching examples.
    data_coefs: the data anchor's weights the co-trained arms run at (the rule picks one per N);
    nll_tolerance: the rule's x (docs/results/README.md)."""

    sizes: tuple[int, ...] = (30, 100, 300, 1000)
    seed: int = 20261203
    heldout_fraction: float = 0.1
    fit_steps: int = 200
    fit_batch: int = 64
    check_every: int = 10
    fit_learning_rate: float = 3e-3
    smoothing: float = 2.0
    vs_steps: int = 100
    vs_batch: int = 64
    data_coefs: tuple[float, ...] = (1.0, 4.0, 16.0)
    nll_tolerance: float = 0.10

    @property
    def max_dialogues(self) -> int:
        return max(self.sizes)


class Split(NamedTuple):
    train: Dialogues
    heldout: Dialogues


def draw(config: DataConfig) -> Dialogues:
    """The `max_dialogues` dialogues of the untrained agent with the population (full length: the P4G
    policy asks only when it must)."""
    rng = np.random.default_rng(config.seed)
    p4g = personas.p4g_policy()[0, :personas.N_STRATEGIES]
    n = config.max_dialogues
    return sample_dialogues(rng, n, p4g, personas.base_simulator()[None], np.zeros(n, np.int64))


def split(dialogues: Dialogues, n: int, heldout_fraction: float) -> Split:
    """The first n dialogues: the last max(1, round(fraction n)) held out, the rest to fit on."""
    if not 2 <= n <= len(dialogues.strategies):
        raise ValueError(f"{n} dialogues asked of {len(dialogues.strategies)} drawn (at least 2)")
    cut = n - max(1, int(round(heldout_fraction * n)))
    head = lambda lo, hi: Dialogues(*(x[lo:hi] for x in dialogues))
    return Split(head(0, cut), head(cut, n))


def token_batch(d: Dialogues, rows: int | None = None) -> TokenBatch:
    """The simulator's view (no card) [rows, SEQ_LEN], loss on its replies; rows beyond the dialogues
    are padding with an empty mask (they change no token mean)."""
    n = len(d.strategies)
    rows = n if rows is None else rows
    if rows < n:
        raise ValueError(f"{n} dialogues do not fit in {rows} rows")
    tokens = np.full((rows, lm.SEQ_LEN), lm.PAD, np.int32)
    tokens[:n] = sim_view(d, np.full(n, lm.NO_CARD))
    mask = np.zeros((rows, lm.SEQ_LEN), np.float32)
    mask[:n, REPLY_POSITIONS] = 1.0
    return TokenBatch(tokens, np.broadcast_to(np.arange(lm.SEQ_LEN, dtype=np.int32), tokens.shape).copy(), mask)


def table_nll(table: np.ndarray, d: Dialogues) -> float:
    """Mean NLL (nats per reply) of the dialogues' replies under a simulator table [N_STATES, S, U]."""
    q = table[d.states, d.strategies, d.replies]
    return float(-np.mean(np.log(np.maximum(q, 1e-300))))


def reply_counts(d: Dialogues) -> np.ndarray:
    """[N_STATES, S, U] how often each reply followed each (state, strategy)."""
    counts = np.zeros((personas.N_STATES, personas.N_STRATEGIES, personas.N_USER))
    np.add.at(counts, (d.states.ravel(), d.strategies.ravel(), d.replies.ravel()), 1.0)
    return counts


def reply_estimate(d: Dialogues, smoothing: float) -> np.ndarray:
    """[N_STATES, S, U]: q(u | i, s) = (c(i, s, u) + a b_s(u)) / (c(i, s) + a), a = `smoothing`, with the
    pooled frequencies b_s(u) = (c(s, u) + 1) / (c(s) + U) (add-one over the reply acts): the data's
    frequencies where a state was seen, the strategy's pooled frequencies where it was not."""
    counts = reply_counts(d)
    pooled = counts.sum(0)
    backoff = (pooled + 1.0) / (pooled.sum(-1, keepdims=True) + personas.N_USER)
    return (counts + smoothing * backoff) / (counts.sum(-1, keepdims=True) + smoothing)


TEMPERATURES = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)  # the calibrated arms' grid (docs/results/README.md)


def bootstrap(d: Dialogues, seed: tuple[int, ...]) -> Dialogues:
    """As many dialogues as d, drawn from it with replacement (numpy, from `seed`)."""
    rows = np.random.default_rng(seed).integers(0, len(d.strategies), len(d.strategies))
    return Dialogues(*(x[rows] for x in d))


def resamples(train: Dialogues, config: DataConfig, n: int, members: int) -> list[Dialogues]:
    """The bootstrap resamples of the fitted part at size n that a population's members see, one each."""
    return [bootstrap(train, (config.seed, n, p)) for p in range(members)]


def temper(table: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(log q / T) over the reply acts of a table [..., U] with positive entries."""
    logits = np.log(np.maximum(table, 1e-300)) / temperature
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def calibrate(table: np.ndarray, heldout: Dialogues) -> float:
    """The temperature of `TEMPERATURES` under which `table` gives `heldout` the lowest NLL (the first
    of equal ones)."""
    return TEMPERATURES[int(np.argmin([table_nll(temper(table, t), heldout) for t in TEMPERATURES]))]
