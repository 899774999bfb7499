"""The simulator-collapse experiment: pretrain, tabulate, run every arm on the same seeds, evaluate exactly.

`run` returns plain numpy results (curves per arm and seed, pretraining diagnostics, exact references,
wall times); `scope_jax.testbed.report` turns them into figures and summaries. Pretrained models are
cached in the run directory (`pretrained.msgpack`), so a resumed run does not pretrain again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from scope_jax import diagnostics
from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed import arms as arms_lib
from scope_jax.testbed import evaluate
from scope_jax.testbed.pretrain import Pretrained, PretrainConfig, model_config, pretrain
from scope_jax.testbed.rl import RLConfig, make_runner
from scope_jax.models import decoder

PRETRAINED = "pretrained.msgpack"
Logger = Callable[[str, int, dict[str, Any]], None]  # (arm, step, metrics)


@dataclasses.dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    pretrain: PretrainConfig
    rl: RLConfig
    heldout_seeds: tuple[int, ...] = (101, 102)


@dataclasses.dataclass
class ArmResult:
    """Per-step curves [R, steps] (step t = 1..steps) and exact evaluations [R, E + 1]
    (steps 0, k, 2k, ...)."""

    label: str
    step_curves: dict[str, np.ndarray]
    eval_steps: np.ndarray
    evals: dict[str, np.ndarray]
    seconds: float


@dataclasses.dataclass
class Results:
    settings: Settings
    arms: dict[str, ArmResult]
    pretraining: dict[str, Any]
    references: dict[str, dict[str, float]]
    seconds: dict[str, float]


class Tabulator:
    """Jitted read-outs of transformer players at every decision state, one model per call (one
    compiled program per read-out, whatever the number of models)."""

    def __init__(self, graphdef):
        self.graphdef = graphdef
        self._policy = jax.jit(lm.agent_policy_table, static_argnums=0)
        self._replies = jax.jit(lm.sim_reply_table, static_argnums=0)
        self._verbal = jax.jit(lm.verbalized_table, static_argnums=0)

    def policies(self, params, lead_ndim: int = 1) -> np.ndarray:
        """[*lead, N_STATES, N_AGENT] float64 for params with `lead_ndim` leading axes."""
        lead = jax.tree.leaves(params)[0].shape[:lead_ndim]
        flat = _flatten(params, lead_ndim)
        out = [lm.as_table(self._policy(self.graphdef, _index(flat, i))) for i in range(int(np.prod(lead)))]
        return np.stack(out).reshape(*lead, *out[0].shape)

    def sims(self, params, cards: np.ndarray) -> np.ndarray:
        """[*cards.shape, N_STATES, S, U]: params with leading axes cards.shape, each with its card."""
        cards = np.asarray(cards)
        flat = _flatten(params, cards.ndim)
        out = [lm.as_table(self._replies(self.graphdef, _index(flat, i), int(c)))
               for i, c in enumerate(cards.reshape(-1))]
        return np.stack(out).reshape(*cards.shape, *out[0].shape)

    def verbalized(self, params, card: int) -> tuple[np.ndarray, np.ndarray]:
        """(stated table [R, N_STATES, S, U], malformed [R, N_STATES, S]) of params [R] with one card."""
        out = [self._verbal(self.graphdef, _index(params, i), card)
               for i in range(jax.tree.leaves(params)[0].shape[0])]
        return np.stack([lm.as_table(q) for q, _ in out]), np.stack([np.asarray(m) for _, m in out])


def _flatten(tree, lead_ndim: int):
    """Merge the first lead_ndim axes of every leaf."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[lead_ndim:]), tree)


def _index(tree, i: int):
    return jax.tree.map(lambda x: x[i], tree)


def _save(path, pre: Pretrained) -> None:
    path.write_bytes(serialization.msgpack_serialize(jax.tree.map(np.asarray, pre._asdict())))


def _load(path) -> Pretrained:
    return Pretrained(**serialization.msgpack_restore(path.read_bytes()))


def _tv(a: np.ndarray, b: np.ndarray, weights: np.ndarray) -> float:
    """On-policy total variation: weights [N_STATES, S] (reach x strategy probability)."""
    return float(np.sum(weights * 0.5 * np.abs(a - b).sum(-1)) / weights.sum())


def _on_policy_weights(policy: np.ndarray, sim: np.ndarray) -> np.ndarray:
    return personas.reach_probabilities(policy, sim)[:, None] * policy[:, :personas.N_STRATEGIES]


def pretraining_diagnostics(agent: np.ndarray, base: np.ndarray, cards: np.ndarray, collapsed: np.ndarray,
                            verbalized: np.ndarray, malformed: np.ndarray, heldout: np.ndarray,
                            population: np.ndarray,
                            heldout_priors: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per seed r: agent [R] policies, base [R] / cards [R, 4] / collapsed [R] / verbalized [R] tables.

    Deviations (1 - p_max, on-policy, exact) and TV distances are taken on the dialogues of the
    pretrained agent with the population (TV) or with the simulator itself (deviation).
    """
    p4g = personas.p4g_policy()[0]
    out: dict[str, Any] = {k: [] for k in (
        "agent_first_turn_tv_to_p4g", "agent_value", "base_tv", "card_tv", "collapsed_tv_to_tabular",
        "base_deviation", "collapsed_deviation", "verbalized_deviation",
        "verbalized_tv", "verbalized_malformed", "population_deviation", "tabular_collapsed_deviation",
        "base_best_response_value", "verbalized_best_response_value")}
    for r in range(len(agent)):
        pi = agent[r]
        w = _on_policy_weights(pi, population)
        out["agent_first_turn_tv_to_p4g"].append(0.5 * float(np.abs(pi[0] - p4g).sum()))
        out["agent_value"].append(personas.policy_value(pi, population))
        out["base_tv"].append(_tv(base[r], population, w))
        out["card_tv"].append([_tv(cards[r, p], personas.persona_simulator(p), w)
                               for p in range(cards.shape[1])])
        out["collapsed_tv_to_tabular"].append(_tv(collapsed[r], personas.collapsed_simulator(), w))
        out["verbalized_tv"].append(_tv(verbalized[r], population, w))
        out["verbalized_malformed"].append(float(malformed[r].mean()))
        # Fidelity ceilings: the population value of the best response to each training simulator.
        for key, table in (("base_best_response_value", base[r]),
                           ("verbalized_best_response_value", verbalized[r])):
            out[key].append(personas.policy_value(personas.best_response(table).policy, population))
        for key, table in (("base_deviation", base[r]), ("collapsed_deviation", collapsed[r]),
                           ("verbalized_deviation", verbalized[r]),
                           ("population_deviation", population),
                           ("tabular_collapsed_deviation", personas.collapsed_simulator())):
            out[key].append(personas.simulator_deviation(pi, table))
    out["heldout"] = []
    for h, prior in enumerate(heldout_priors):
        prior = np.asarray(prior) / np.sum(prior)
        truth = personas.base_simulator(personas.TABLES, prior)
        tv = _tv(heldout[h], truth, _on_policy_weights(agent[0], truth))
        out["heldout"].append({"prior": prior.tolist(), "tv_to_own_population": tv,
                               "deviation": personas.simulator_deviation(agent[0], heldout[h]),
                               "untrained_value": personas.policy_value(agent[0], heldout[h])})
    return out


class Tables(NamedTuple):
    """Every pretrained model read out at every decision state (float64), per seed R."""

    agent: np.ndarray  # [R, N_STATES, N_AGENT] the pretrained agent
    base: np.ndarray  # [R, N_STATES, S, U] base simulator, no card
    cards: np.ndarray  # [R, 4, ...] base simulator with each persona's card
    collapsed: np.ndarray  # [R, C, ...] collapsed simulators, no card (C = 0 is the emotional mode)
    verbalized: np.ndarray  # [R, ...] the emotional collapsed simulator answering by greedy verbalization
    malformed: np.ndarray  # [R, N_STATES, S] its malformed verbalizations (replaced by direct replies)
    heldout: np.ndarray  # [H, ...] held-out simulators, no card


def tabulate(tab: Tabulator, pre: Pretrained) -> Tables:
    R = len(pre.losses["agent"])
    cards = np.asarray([lm.card_token(p) for p in range(len(personas.PERSONAS))])
    C = jax.tree.leaves(pre.collapsed)[0].shape[1]
    H = jax.tree.leaves(pre.heldout)[0].shape[0]
    verbalized, malformed = tab.verbalized(jax.tree.map(lambda x: x[:, 0], pre.collapsed), lm.NO_CARD)
    return Tables(
        agent=tab.policies(pre.agent),
        base=tab.sims(pre.base, np.full(R, lm.NO_CARD)),
        cards=tab.sims(jax.tree.map(lambda x: jnp.repeat(x[:, None], len(cards), 1), pre.base),
                       np.broadcast_to(cards, (R, len(cards)))),
        collapsed=tab.sims(pre.collapsed, np.full((R, C), lm.NO_CARD)),
        verbalized=verbalized, malformed=malformed,
        heldout=tab.sims(pre.heldout, np.full(H, lm.NO_CARD)))


def run_arm(arm: arms_lib.Arm, settings: Settings, pre: Pretrained, tables: Tables, tab: Tabulator,
            runner, keys: jax.Array, log: Logger) -> ArmResult:
    """Train one arm on every seed (one compiled call), evaluate its snapshots exactly, log every point."""
    start, R, rl = time.perf_counter(), len(settings.seeds), settings.rl
    population = personas.base_simulator()
    frozen_sims = {"frozen": tables.collapsed[:, :1], "untrained": tables.collapsed[:, :1],
                   "verbalized": tables.verbalized[:, None], "rotation": tables.collapsed}
    step_curves: dict[str, np.ndarray] = {}
    if not arm.trains:  # evaluated against the simulator RL would train on
        policies, steps = tables.agent[:, None], np.zeros(1, int)
        sim_tables = frozen_sims["untrained"][:, None]
    else:
        sims, refs = arms_lib.simulators(arm, pre)
        cards = np.asarray(arms_lib.cards(arm))
        _, logs, snaps = runner(pre.agent, sims, refs, jnp.asarray(cards), jnp.asarray(arm.verbalized),
                                jnp.asarray(arm.train_sims), keys)
        logs = jax.tree.map(np.asarray, logs)
        policies = np.concatenate([tables.agent[:, None], tab.policies(snaps.agent, 2)], axis=1)
        steps = np.arange(0, rl.steps + 1, rl.eval_every)
        if arm.train_sims:
            initial = tab.sims(sims, np.broadcast_to(cards, (R, arm.members)))
            trained = tab.sims(snaps.sims, np.broadcast_to(cards, (R, len(steps) - 1, arm.members)))
            sim_tables = np.concatenate([initial[:, None], trained], axis=1)  # [R, E + 1, P, ...]
        else:
            fixed = frozen_sims[arm.name]
            sim_tables = np.broadcast_to(fixed[:, None], (R, len(steps), *fixed.shape[1:]))
        groups = np.arange(rl.episodes) // rl.group_size
        step_curves = {k: v for k, v in logs._asdict().items() if k != "rewards"}
        step_curves["zero_variance_groups"] = np.array(
            [[diagnostics.zero_variance_fraction(logs.rewards[r, t], groups) for t in range(rl.steps)]
             for r in range(R)])
        for t in range(rl.steps):
            log(arm.name, t + 1, {f"{k}/seed{settings.seeds[r]}": float(v[r, t])
                                  for k, v in step_curves.items() for r in range(R)})
    evals = [[evaluate.exact_metrics(policies[r, e], list(sim_tables[r, e]), population, list(tables.heldout))
              for e in range(len(steps))] for r in range(R)]
    eval_curves = {k: np.array([[ev[k] for ev in row] for row in evals]) for k in evals[0][0]}
    for e, step in enumerate(steps):
        log(arm.name, int(step), {f"{k}/seed{settings.seeds[r]}": float(v[r, e])
                                  for k, v in eval_curves.items() for r in range(R)})
    return ArmResult(arm.label, step_curves, steps, eval_curves, time.perf_counter() - start)


def run(settings: Settings, cache_dir, log: Logger, progress: Callable[[str], None] = print) -> Results:
    """The whole experiment; `log(arm, step, metrics)` receives every curve point as it is computed."""
    start = time.perf_counter()
    unknown = set(settings.arms) - set(arms_lib.ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {', '.join(arms_lib.ARMS)}")
    cache = cache_dir / PRETRAINED
    if cache.exists():
        pre = _load(cache)
        progress("pretrained models loaded from the run directory")
    else:
        progress("pretraining agent and simulators")
        pre = pretrain(settings.pretrain, settings.seeds, arms_lib.collapse_personas(settings.arms),
                       settings.heldout_seeds)
        _save(cache, pre)
    seconds = {"pretrain": time.perf_counter() - start}

    graphdef, _ = decoder.init(model_config(settings.pretrain), seed=0)
    tab = Tabulator(graphdef)
    t0 = time.perf_counter()
    tables = tabulate(tab, pre)
    diag = pretraining_diagnostics(tables.agent, tables.base, tables.cards, tables.collapsed[:, 0],
                                   tables.verbalized, tables.malformed, tables.heldout,
                                   personas.base_simulator(), settings.pretrain.heldout_priors)
    diag["sft_losses"] = {k: np.asarray(v).tolist() for k, v in pre.losses.items()}
    seconds["tabulate"] = time.perf_counter() - t0

    runners: dict[int, Any] = {}  # one compiled program per population size
    keys = jax.random.split(jax.random.key(sum(settings.seeds) + 7919), len(settings.seeds))  # shared by arms
    results: dict[str, ArmResult] = {}
    for name in settings.arms:
        arm = arms_lib.ARMS[name]
        progress(f"arm {name}")
        if arm.trains and arm.members not in runners:
            runners[arm.members] = make_runner(graphdef, graphdef, settings.rl, arm.members)
        results[name] = run_arm(arm, settings, pre, tables, tab, runners.get(arm.members), keys, log)
        seconds[f"arm/{name}"] = results[name].seconds
    seconds["total"] = time.perf_counter() - start
    return Results(settings, results, diag, evaluate.reference_values(personas.base_simulator()), seconds)
