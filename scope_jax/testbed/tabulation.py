"""Transformer players read out at every decision state of the persona game (`Tabulator`), every
pretrained model tabulated (`tabulate`), and how the pretrained players compare with the game's tables
(`pretraining_diagnostics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed.gradients import POLICY_TABLE
from scope_jax.testbed.pretrain import Pretrained
from scope_jax.testbed.progress import Ticker
from scope_jax.training.state import leaves_at


def _flatten(tree, lead_ndim: int):
    """Merge the first lead_ndim axes of every leaf."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[lead_ndim:]), tree)


# Module-level, so that every Tabulator shares their compiled programs (and the panel the policy's).
_REPLIES = jax.jit(lm.sim_reply_table, static_argnums=0)
_VERBAL = jax.jit(lm.verbalized_table, static_argnums=(0, 4))


class Tabulator:
    """Jitted read-outs of transformer players at every decision state, one model per call (one
    compiled program per read-out, whatever the number of models). With workers > 1 the models after
    the first (which compiles) are read out on that many threads."""

    def __init__(self, graphdef, workers: int = 1, say: Callable[[str], None] | None = None):
        self.graphdef = graphdef
        self.workers = workers
        self.say = say  # progress lines of each read-out (None: quiet)

    def _map(self, fn: Callable, items: Sequence, what: str) -> list:
        ticker = Ticker(f"reading out {len(items)} {what}", len(items), self.say) if self.say else None
        out = []

        def tick(item):
            result = fn(item)
            out.append(None)
            if ticker:
                ticker(len(out))
            return result

        if self.workers == 1 or len(items) < 2:
            return [tick(item) for item in items]
        first = tick(items[0])
        with ThreadPoolExecutor(self.workers) as pool:
            return [first, *pool.map(tick, items[1:])]

    def policies(self, params, lead_ndim: int = 1) -> np.ndarray:
        """[*lead, N_STATES, N_AGENT] float64 for params with `lead_ndim` leading axes."""
        lead = jax.tree.leaves(params)[0].shape[:lead_ndim]
        flat = _flatten(params, lead_ndim)
        out = self._map(lambda i: lm.as_table(POLICY_TABLE(self.graphdef, leaves_at(flat, i))),
                        range(int(np.prod(lead))), "agent policies")
        return np.stack(out).reshape(*lead, *out[0].shape)

    def sims(self, params, cards: np.ndarray) -> np.ndarray:
        """[*cards.shape, N_STATES, S, U]: params with leading axes cards.shape, each with its card."""
        cards = np.asarray(cards)
        flat = _flatten(params, cards.ndim)
        out = self._map(lambda ic: lm.as_table(_REPLIES(self.graphdef, leaves_at(flat, ic[0]), int(ic[1]))),
                        list(enumerate(cards.reshape(-1))), "simulators' replies")
        return np.stack(out).reshape(*cards.shape, *out[0].shape)

    def verbalized(self, params, card: int, keys: Sequence[jax.Array],
                   samples: int) -> tuple[np.ndarray, np.ndarray]:
        """(what VS trains against [R, N_STATES, S, U], malformed fraction [R, N_STATES, S]) of params [R]."""
        out = self._map(lambda ik: _VERBAL(self.graphdef, leaves_at(params, ik[0]), card, ik[1], samples),
                        list(enumerate(keys)), "Verbalized Sampling simulators (sampled verbalizations)")
        return np.stack([lm.as_table(q) for q, _ in out]), np.stack([np.asarray(m) for _, m in out])


def _tv(a: np.ndarray, b: np.ndarray, weights: np.ndarray) -> float:
    """On-policy total variation: weights [N_STATES, S] (reach x strategy probability)."""
    return float(np.sum(weights * 0.5 * np.abs(a - b).sum(-1)) / weights.sum())


def _on_policy_weights(policy: np.ndarray, sim: np.ndarray) -> np.ndarray:
    return personas.reach_probabilities(policy, sim)[:, None] * policy[:, :personas.N_STRATEGIES]


class Tables(NamedTuple):
    """Every pretrained model read out at every decision state (float64), per seed R."""

    agent: np.ndarray  # [R, N_STATES, N_AGENT] the pretrained agent
    base: np.ndarray  # [R, N_STATES, S, U] base simulator, no card
    cards: np.ndarray  # [R, 4, ...] base simulator with each persona's card
    collapsed: np.ndarray  # [R, C, ...] collapsed simulators, no card (C = 0 is the emotional mode)
    verbalized: np.ndarray  # [R, ...] what the emotional collapsed simulator's Verbalized Sampling answers
    vs_malformed: np.ndarray  # [R, N_STATES, S] fraction of its verbalizations that fall back
    heldout: np.ndarray  # [H, ...] held-out simulators, no card
    selfplay_agent: np.ndarray | None  # [R, N_STATES, N_AGENT] the joint model's agent role
    selfplay: np.ndarray | None  # [R, ...] the joint model's user role, no card


def tabulate(tab: Tabulator, pre: Pretrained, vs_samples: int, seeds: Sequence[int]) -> Tables:
    R = len(seeds)
    cards = np.asarray([lm.card_token(p) for p in range(len(personas.PERSONAS))])
    C = jax.tree.leaves(pre.collapsed)[0].shape[1]
    H = jax.tree.leaves(pre.heldout)[0].shape[0]
    keys = [jax.random.fold_in(jax.random.key(8191), s) for s in seeds]
    verbalized, malformed = tab.verbalized(jax.tree.map(lambda x: x[:, 0], pre.collapsed), lm.NO_CARD, keys,
                                           vs_samples)
    joint = pre.selfplay is not None
    return Tables(
        agent=tab.policies(pre.agent),
        base=tab.sims(pre.base, np.full(R, lm.NO_CARD)),
        cards=tab.sims(jax.tree.map(lambda x: jnp.repeat(x[:, None], len(cards), 1), pre.base),
                       np.broadcast_to(cards, (R, len(cards)))),
        collapsed=tab.sims(pre.collapsed, np.full((R, C), lm.NO_CARD)),
        verbalized=verbalized, vs_malformed=malformed,
        heldout=tab.sims(pre.heldout, np.full(H, lm.NO_CARD)),
        selfplay_agent=tab.policies(pre.selfplay) if joint else None,
        selfplay=tab.sims(pre.selfplay, np.full(R, lm.NO_CARD)) if joint else None)


def pretraining_diagnostics(tables: Tables, population: np.ndarray,
                            heldout_priors: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per seed: how the pretrained players compare with the game's tables.

    Deviations (1 - p_max, on-policy, exact) and TV distances are taken on the dialogues of the
    pretrained agent with the population (TV) or with the simulator itself (deviation).
    """
    p4g = personas.p4g_policy()[0]
    out: dict[str, Any] = {k: [] for k in (
        "agent_first_turn_tv_to_p4g", "agent_value", "base_tv", "card_tv", "collapsed_tv_to_tabular",
        "base_deviation", "collapsed_deviation", "verbalized_deviation", "verbalized_tv",
        "verbalized_tv_to_base", "verbalized_malformed", "population_deviation",
        "tabular_collapsed_deviation",
        "base_best_response_value", "verbalized_best_response_value")}
    for r, pi in enumerate(tables.agent):
        w = _on_policy_weights(pi, population)
        out["agent_first_turn_tv_to_p4g"].append(0.5 * float(np.abs(pi[0] - p4g).sum()))
        out["agent_value"].append(personas.policy_value(pi, population))
        out["base_tv"].append(_tv(tables.base[r], population, w))
        out["card_tv"].append([_tv(tables.cards[r, p], personas.persona_simulator(p), w)
                               for p in range(tables.cards.shape[1])])
        out["collapsed_tv_to_tabular"].append(_tv(tables.collapsed[r, 0], personas.collapsed_simulator(), w))
        out["verbalized_tv"].append(_tv(tables.verbalized[r], population, w))
        out["verbalized_tv_to_base"].append(_tv(tables.verbalized[r], tables.base[r], w))
        out["verbalized_malformed"].append(float(np.sum(w * tables.vs_malformed[r]) / w.sum()))
        # Fidelity ceilings: the population value of the best response to each training simulator.
        for key, table in (("base_best_response_value", tables.base[r]),
                           ("verbalized_best_response_value", tables.verbalized[r])):
            out[key].append(personas.policy_value(personas.best_response(table).policy, population))
        for key, table in (("base_deviation", tables.base[r]),
                           ("collapsed_deviation", tables.collapsed[r, 0]),
                           ("verbalized_deviation", tables.verbalized[r]),
                           ("population_deviation", population),
                           ("tabular_collapsed_deviation", personas.collapsed_simulator())):
            out[key].append(personas.simulator_deviation(pi, table))
    if tables.selfplay is not None:
        out["selfplay_agent_value"] = [personas.policy_value(pi, population) for pi in tables.selfplay_agent]
        out["selfplay_deviation"] = [personas.simulator_deviation(pi, q)
                                     for pi, q in zip(tables.selfplay_agent, tables.selfplay)]
    out["heldout"] = []
    for h, prior in enumerate(heldout_priors):
        prior = np.asarray(prior) / np.sum(prior)
        truth = personas.base_simulator(personas.TABLES, prior)
        tv = _tv(tables.heldout[h], truth, _on_policy_weights(tables.agent[0], truth))
        out["heldout"].append({"prior": prior.tolist(), "tv_to_own_population": tv,
                               "deviation": personas.simulator_deviation(tables.agent[0], tables.heldout[h]),
                               "untrained_value": personas.policy_value(tables.agent[0], tables.heldout[h])})
    return out
