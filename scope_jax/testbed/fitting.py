"""Simulators fitted to user data with the project's SFT step (`training.sft_step`), every seed at once.

The seeds' models are the SFT step's population axis (role "sims", one member per seed, each on the
same rows), trained by Adam without gradient clipping (a clip of the global norm would couple the
seeds), so each seed's fit is its own.

* `fit_replies`: the collapsed simulator fine-tuned on the dialogues' replies (loss on the simulator's
  reply tokens only, log-probs over the reply acts as it samples), a batch of rows drawn with
  replacement per step, early-stopped: every `check_every` steps the NLL on the held-out dialogues is
  measured and each seed keeps its best parameters.
* `teach_verbalization`: the collapsed simulator taught to state a reply table (Verbalized Sampling's
  instruction following, as in pretraining), on histories of uniformly random strategies and replies,
  so no state's prompt depends on the population.
* a population: member p of the collapsed models fitted by `fit_replies` on its own bootstrap resample
  (`user_data.resamples`).
* `tempered`: a model whose every logit is divided by a temperature.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models.decoder import Params
from scope_jax.testbed import user_data
from scope_jax.testbed.pretrain import Dialogues, sample_dialogues, verbalization_examples
from scope_jax.testbed.progress import Ticker
from scope_jax.training import state as joint
from scope_jax.training.batch import TokenBatch
from scope_jax.training.loss import LossConfig, aggregation_weights, nll_loss
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.sft_step import SFTStepConfig, make_sft_step

REPLIES = LossConfig(allowed_tokens=lm.REPLY_ACTS)
VERBALIZATION = LossConfig()  # act and probability tokens: the full vocabulary


def _members(batch: TokenBatch, members: int) -> TokenBatch:
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (members, *x.shape)), batch)


class Fitter:
    """Jitted SFT steps and held-out NLL for one architecture (compiled once per batch shape)."""

    def __init__(self, graphdef: nnx.GraphDef, learning_rate: float):
        self.optimizer = make_optimizer(OptimizerConfig(learning_rate=learning_rate,
                                                        sim_learning_rate=learning_rate, max_grad_norm=0.0),
                                        {"sims": True})
        self.steps = {loss: jax.jit(make_sft_step(graphdef, self.optimizer, SFTStepConfig(role="sims", loss=loss)))
                      for loss in (REPLIES, VERBALIZATION)}

        def member_nll(params, batch):
            weights = aggregation_weights(batch.loss_mask, "token_mean")
            return nll_loss(graphdef, params, batch, weights, REPLIES)[0]

        self.nll = jax.jit(jax.vmap(member_nll))  # (params [R], batch [R, N, L]) -> [R]

    def fit_replies(self, params: Params, train: TokenBatch, heldout: TokenBatch, steps: int, check_every: int,
                    batch: int, seed: int, say: Callable[[str], None] = print,
                    label: str = "fit") -> tuple[Params, np.ndarray]:
        """(best params [R], their held-out NLL [R]) over `steps` steps on `batch` rows of `train` [N, L]
        drawn with replacement (numpy, from `seed`)."""
        R = jax.tree.leaves(params)[0].shape[0]
        heldout = _members(heldout, R)
        rows = np.random.default_rng(seed).integers(0, len(train.tokens), (steps, batch))
        state = joint.create({"sims": params}, self.optimizer, seed=0)
        best, best_nll = params, self.nll(params, heldout)
        ticker = Ticker(label, steps, say)
        for i in range(1, steps + 1):
            state, _ = self.steps[REPLIES](state, _members(jax.tree.map(lambda x: x[rows[i - 1]], train), R))
            if i % check_every == 0 or i == steps:
                nll = self.nll(state.params["sims"], heldout)
                better = nll < best_nll
                best = jax.tree.map(lambda b, p: jnp.where(better.reshape((R,) + (1,) * (p.ndim - 1)), p, b),
                                    best, state.params["sims"])
                best_nll = jnp.where(better, nll, best_nll)
            ticker(i)
        return best, np.asarray(best_nll)

    def teach_verbalization(self, params: Params, table: np.ndarray, steps: int, batch: int, seed: int,
                            say: Callable[[str], None] = print, label: str = "teach") -> Params:
        """params [R] after `steps` steps of stating `table` [N_STATES, S, U] (`persona_lm.verbalize`)."""
        R = jax.tree.leaves(params)[0].shape[0]
        rng = np.random.default_rng(seed)
        n = steps * batch
        uniform = np.full((1, personas.N_STATES, personas.N_STRATEGIES, personas.N_USER), 1.0 / personas.N_USER)
        histories = sample_dialogues(rng, n, np.full(personas.N_STRATEGIES, 1.0 / personas.N_STRATEGIES),
                                     uniform, np.zeros(n, np.int64))
        tokens, mask = verbalization_examples(rng, histories, table, n)
        positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
        state = joint.create({"sims": params}, self.optimizer, seed=0)
        ticker = Ticker(label, steps, say)
        for i in range(steps):
            rows = slice(i * batch, (i + 1) * batch)
            state, _ = self.steps[VERBALIZATION](state, _members(TokenBatch(tokens[rows], positions[rows],
                                                                            mask[rows]), R))
            ticker(i + 1)
        return state.params["sims"]


def tempered(params: Params, temperature: np.ndarray) -> Params:
    """params [R] with every logit divided by temperature [R]: the final RMSNorm's weight divided by it
    (the testbed's decoders tie the output head to the embedding, so the norm's output feeds the logits
    and nothing else)."""
    t = jnp.asarray(temperature, params["norm"]["weight"].dtype)
    return {**params, "norm": {**params["norm"], "weight": params["norm"]["weight"] / t[:, None]}}


POPULATION = "fitted_population"
FITS = ("fitted", "vs_fitted", POPULATION)  # what `fit_to_data` makes


def fit_to_data(fitter: Fitter, collapsed: Params, data: Dialogues, config: user_data.DataConfig,
                starts: tuple[str, ...] = ("fitted", "vs_fitted"),
                say: Callable[[str], None] = print) -> dict[str, dict[int, Params]]:
    """For every N of `config.sizes` and start of `starts` (of FITS): {start: {N: params [R, P]}} from
    the collapsed simulators [R, C] (C = 0: the emotional one, the start of "fitted" and "vs_fitted";
    member p of the population starts from model p)."""
    unknown = set(starts) - set(FITS)
    if unknown:
        raise ValueError(f"fit_to_data makes {FITS}, not {sorted(unknown)}")
    out: dict[str, dict[int, Params]] = {start: {} for start in starts}
    member = lambda p: jax.tree.map(lambda x: x[:, p], collapsed)
    stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x, axis=1), *trees)
    for n in config.sizes:
        part = user_data.split(data, n, config.heldout_fraction)
        heldout = user_data.token_batch(part.heldout)
        fit = lambda params, train, label: fitter.fit_replies(
            params, user_data.token_batch(train), heldout, config.fit_steps, config.check_every,
            config.fit_batch, config.seed + n, say, label)[0]
        if "fitted" in starts:
            out["fitted"][n] = stack([fit(member(0), part.train,
                                          f"fitting the collapsed simulator to {n} dialogues")])
        if "vs_fitted" in starts:
            estimate = user_data.reply_estimate(part.train, config.smoothing)
            out["vs_fitted"][n] = stack([fitter.teach_verbalization(
                member(0), estimate, config.vs_steps, config.vs_batch, config.seed + n, say,
                f"teaching Verbalized Sampling the reply frequencies of {n} dialogues")])
        if POPULATION in starts:
            members = jax.tree.leaves(collapsed)[0].shape[1]
            out[POPULATION][n] = stack([
                fit(member(p), resample, f"fitting population member {p} to a resample of {n} dialogues")
                for p, resample in enumerate(user_data.resamples(part.train, config, n, members))])
    return out
