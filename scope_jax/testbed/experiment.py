"""The simulator-collapse experiment: pretrain, tabulate, run every arm on the same seeds, evaluate exactly.

`run` returns plain numpy results (curves per arm and seed, pretraining diagnostics, exact references,
wall times); `scope_jax.testbed.report` turns them into figures and summaries.

Arms run on `Settings.workers` threads, which take them in `arm_order` and compile each RL program
once (`CompileOnce`): XLA:CPU runs this game's tiny programs on about one core each, so a second
thread nearly doubles the arms' throughput on two cores. No arm's numbers depend on it.

With data arms (`Settings.data`), the user dialogues are drawn and the simulators fitted to them
(`testbed.fitting`) after tabulation; the fitted models are kept in `fitted.msgpack`.

The run directory keeps what is done: the pretrained models (`pretrained.msgpack`) and every finished
arm (`arms/NAME.msgpack`, written before its metrics are logged). A resumed run loads both, reruns only
the arms that did not finish, and keeps each arm's records in `metrics.jsonl` exactly once (an arm
whose records are incomplete, from a run killed while logging, has them dropped and logged again from
its saved result).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from scope_jax import diagnostics
from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.testbed import arms as arms_lib
from scope_jax.testbed import evaluate, user_data
from scope_jax.testbed.arms import FITTED_STARTS, Arm
from scope_jax.testbed.fitting import POPULATION, Fitter, fit_to_data, tempered
from scope_jax.testbed.gradients import POLICY_TABLE, GradientPanel
from scope_jax.testbed.pretrain import Pretrained, PretrainConfig, model_config, pretrain
from scope_jax.testbed.progress import Ticker
from scope_jax.testbed.rl import RLConfig, arm_inputs, make_runner
from scope_jax.training.run_dir import METRICS, RunDir

PRETRAINED = "pretrained.msgpack"
FITTED = "fitted.msgpack"
ARMS_DIR = "arms"


@dataclasses.dataclass(frozen=True)
class Settings:
    """vs_samples: verbalizations drawn per (state, strategy) to estimate what Verbalized Sampling
    trains against (`persona_lm.verbalized_table`). pretrain_for: pretrain the models of other arms
    too (the sweep pretrains the default's, so that the default run can resume from its pretraining).
    workers: threads the arms run on. data: the user data of the data arms (None: no data arm)."""

    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]
    pretrain: PretrainConfig
    rl: RLConfig
    heldout_seeds: tuple[int, ...] = (101, 102)
    vs_samples: int = 2
    pretrain_for: tuple[Arm, ...] = ()  # the arms whose models pretraining makes; () = `arms`
    workers: int = 1
    data: user_data.DataConfig | None = None


@dataclasses.dataclass
class ArmResult:
    """Per-step curves [R, steps] (step t = 1..steps) and exact evaluations [R, E + 1]
    (steps 0, k, 2k, ...)."""

    label: str
    step_curves: dict[str, np.ndarray]
    eval_steps: np.ndarray
    evals: dict[str, np.ndarray]
    seconds: float

    @property
    def records(self) -> int:
        """How many metrics.jsonl records logging this arm writes."""
        return (self.step_curves["reward"].shape[1] if self.step_curves else 0) + len(self.eval_steps)


@dataclasses.dataclass
class Results:
    settings: Settings
    arms: dict[str, ArmResult]
    pretraining: dict[str, Any]
    references: dict[str, dict[str, float]]
    seconds: dict[str, float]


def _flatten(tree, lead_ndim: int):
    """Merge the first lead_ndim axes of every leaf."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[lead_ndim:]), tree)


def _index(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


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
        out = self._map(lambda i: lm.as_table(POLICY_TABLE(self.graphdef, _index(flat, i))),
                        range(int(np.prod(lead))), "agent policies")
        return np.stack(out).reshape(*lead, *out[0].shape)

    def sims(self, params, cards: np.ndarray) -> np.ndarray:
        """[*cards.shape, N_STATES, S, U]: params with leading axes cards.shape, each with its card."""
        cards = np.asarray(cards)
        flat = _flatten(params, cards.ndim)
        out = self._map(lambda ic: lm.as_table(_REPLIES(self.graphdef, _index(flat, ic[0]), int(ic[1]))),
                        list(enumerate(cards.reshape(-1))), "simulators' replies")
        return np.stack(out).reshape(*cards.shape, *out[0].shape)

    def verbalized(self, params, card: int, keys: Sequence[jax.Array],
                   samples: int) -> tuple[np.ndarray, np.ndarray]:
        """(what VS trains against [R, N_STATES, S, U], malformed fraction [R, N_STATES, S]) of params [R]."""
        out = self._map(lambda ik: _VERBAL(self.graphdef, _index(params, ik[0]), card, ik[1], samples),
                        list(enumerate(keys)), "Verbalized Sampling simulators (sampled verbalizations)")
        return np.stack([lm.as_table(q) for q, _ in out]), np.stack([np.asarray(m) for _, m in out])


def _save(path, tree: dict) -> None:
    """Write atomically (a killed run leaves the old file or the new one, never half of one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(serialization.msgpack_serialize(
        jax.tree.map(lambda x: x if isinstance(x, str) else np.asarray(x), tree)))
    os.replace(tmp, path)


def _restore(path) -> dict:
    return serialization.msgpack_restore(path.read_bytes())


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


class Fitted(NamedTuple):
    """The simulators fitted to user data, per start in FITTED_STARTS and size N: params [R, P] and what
    they answer with [R, P, N_STATES, S, U] (Verbalized Sampling: its estimate, as `Tables.verbalized`),
    each size's split of the dialogues, the population members' resamples of its fitted part, and the
    calibrated arms' temperatures [R]."""

    params: dict[str, dict[int, Any]]
    tables: dict[str, dict[int, np.ndarray]]
    splits: dict[int, user_data.Split]
    resamples: dict[int, list[user_data.Dialogues]]
    temperatures: dict[int, np.ndarray]


def fit(settings: Settings, pre: Pretrained, tab: Tabulator, graphdef, run_dir: RunDir,
        progress: Callable[[str], None]) -> Fitted:
    """Draw the user data, fit the collapsed simulators to it (or load the fits), read them out, and
    calibrate the fit's temperature on the held-out dialogues where an arm needs it."""
    config = settings.data
    dialogues = user_data.draw(config)
    cache = run_dir.path / FITTED
    needed = {arm.start for arm in settings.arms if arm.data}
    calibrated = "fitted_calibrated" in needed  # made from "fitted"
    fits = tuple(sorted((needed - {"fitted_calibrated"}) | ({"fitted"} if calibrated else set())))
    if cache.exists() and set(fits) <= set(cached := _restore(cache)):
        params = {start: {int(n): p for n, p in cached[start].items() if int(n) in config.sizes}
                  for start in fits}
        progress("fitted simulators loaded from the run directory")
    else:
        fitter = Fitter(graphdef, config.fit_learning_rate)
        params = fit_to_data(fitter, pre.collapsed, dialogues, config, fits, progress)
        if run_dir.primary:
            _save(cache, {start: {str(n): p for n, p in by_n.items()} for start, by_n in params.items()})
    R = len(settings.seeds)
    keys = [jax.random.fold_in(jax.random.key(8191), s) for s in settings.seeds]  # as `tabulate`'s
    splits = {n: user_data.split(dialogues, n, config.heldout_fraction) for n in config.sizes}
    progress("reading out the fitted simulators")
    read = lambda p: tab.sims(p, np.full(jax.tree.leaves(p)[0].shape[:2], lm.NO_CARD))
    tables = {start: {n: read(p) for n, p in params[start].items()} for start in fits if start != "vs_fitted"}
    if "vs_fitted" in fits:
        tables["vs_fitted"] = {n: tab.verbalized(jax.tree.map(lambda x: x[:, 0], p), lm.NO_CARD, keys,
                                                 settings.vs_samples)[0][:, None]
                               for n, p in params["vs_fitted"].items()}
    temperatures = {}
    if calibrated:
        params["fitted_calibrated"], tables["fitted_calibrated"] = {}, {}
        for n, table in tables["fitted"].items():
            temperatures[n] = np.array([user_data.calibrate(table[r, 0], splits[n].heldout)
                                        for r in range(R)])
            fit = jax.tree.map(lambda x: x[:, 0], params["fitted"][n])
            params["fitted_calibrated"][n] = jax.tree.map(lambda x: x[:, None], tempered(fit, temperatures[n]))
            tables["fitted_calibrated"][n] = read(params["fitted_calibrated"][n])
    members = jax.tree.leaves(pre.collapsed)[0].shape[1]
    resamples = {n: user_data.resamples(splits[n].train, config, n, members) for n in config.sizes}
    return Fitted(params, tables, splits, resamples, temperatures)


def start_tables(arm: Arm, tables: Tables, fitted: Fitted | None = None) -> np.ndarray:
    """[R, P, N_STATES, S, U]: the distributions an arm's simulators answer with before RL."""
    if arm.start in FITTED_STARTS:
        return fitted.tables[arm.start][arm.data]
    if arm.trains and arm.spec.verbalized:
        return tables.verbalized[:, None]
    return {"collapsed": lambda: tables.collapsed[:, :1], "base": lambda: tables.base[:, None],
            "collapsed_modes": lambda: tables.collapsed, "persona_modes": lambda: tables.cards,
            "selfplay": lambda: tables.selfplay[:, None]}[arm.start]()


def run_arm(arm: Arm, settings: Settings, pre: Pretrained, tables: Tables, tab: Tabulator,
            panel: GradientPanel, keys: jax.Array, fitted: Fitted | None = None) -> ArmResult:
    """Train one arm on every seed (one compiled call) and evaluate its snapshots exactly. Arms with
    data also get `data_nll`: the NLL of the held-out dialogues under the training simulator."""
    start, R, rl = time.perf_counter(), len(settings.seeds), settings.rl
    population = personas.base_simulator()
    initial = start_tables(arm, tables, fitted)
    self_play = arm.start == "selfplay"
    agent0 = pre.selfplay if self_play else pre.agent
    policy0 = tables.selfplay_agent if self_play else tables.agent
    step_curves: dict[str, np.ndarray] = {}
    agent_params = lambda r, e: _index(agent0, r)
    if not arm.trains:  # evaluated against the simulator RL would train on
        policies, steps, sim_tables = policy0[:, None], np.zeros(1, int), initial[:, None]
    else:
        sims, refs = arms_lib.simulators(arm, pre, fitted and fitted.params)
        cards = arms_lib.cards(arm)
        kl = rl.sim_kl_coef if arm.sim_kl_coef is None else arm.sim_kl_coef
        lr = rl.sim_learning_rate if arm.sim_learning_rate is None else arm.sim_learning_rate
        objective = arms_lib.OBJECTIVES[arm.objective]
        program = make_runner(tab.graphdef, tab.graphdef, rl, arm.members, kl, self_play, arm.data_coef,
                              objective.best_response)
        anchor = {}
        if arm.data_coef:
            anchor = anchor_data(arm, fitted, settings.data.max_dialogues)
        inputs = arm_inputs(cards, arms_lib.voices(arm, rl.steps, rl.rotation_block), arm.spec.verbalized,
                            lr if arm.spec.trains_sims else 0.0, objective.sign, **anchor)
        _, logs, snaps = COMPILED(program.run, agent0, sims, refs, inputs, keys)
        logs = jax.tree.map(np.asarray, logs)
        policies = np.concatenate([policy0[:, None], tab.policies(snaps.agent, 2)], axis=1)
        agent_params = lambda r, e: _index(agent0, r) if e == 0 else _index(snaps.agent, (r, e - 1))
        steps = np.arange(0, rl.steps + 1, rl.eval_every)
        if arm.spec.trains_sims:
            trained = tab.sims(snaps.sims, np.broadcast_to(cards, (R, len(steps) - 1, arm.members)))
            sim_tables = np.concatenate([initial[:, None], trained], axis=1)  # [R, E + 1, P, ...]
        else:
            sim_tables = np.broadcast_to(initial[:, None], (R, len(steps), *initial.shape[1:]))
        groups = np.arange(rl.episodes) // rl.group_size
        step_curves = {k: v for k, v in logs._asdict().items() if k != "rewards"}
        step_curves["zero_variance_groups"] = np.array(
            [[diagnostics.zero_variance_fraction(logs.rewards[r, t], groups) for t in range(rl.steps)]
             for r in range(R)])
    evals = [[evaluate.exact_metrics(policies[r, e], list(sim_tables[r, e]), population, list(tables.heldout),
                                     list(initial[r]))
              | panel(agent_params(r, e), sim_tables[r, e], population)
              for e in range(len(steps))] for r in range(R)]
    eval_curves = {k: np.array([[ev[k] for ev in row] for row in evals]) for k in evals[0][0]}
    if arm.data:
        heldout = fitted.splits[arm.data].heldout
        nll = lambda tables: np.mean([user_data.table_nll(q, heldout) for q in tables])  # over members
        eval_curves["data_nll"] = np.array([[nll(sim_tables[r, e]) for e in range(len(steps))] for r in range(R)])
    return ArmResult(arm.label, step_curves, steps, eval_curves, time.perf_counter() - start)


def anchor_data(arm: Arm, fitted: Fitted, rows: int) -> dict[str, Any]:
    """`rl.arm_inputs`'s data anchor of an arm: each member's dialogues [P, rows, L] (a population
    member's own resample of the fitted part, else the fitted part) and how many rows hold them [P]."""
    train = fitted.splits[arm.data].train
    own = fitted.resamples[arm.data] if arm.start == POPULATION else [train] * arm.members
    batches = [user_data.token_batch(d, rows) for d in own]
    return dict(data=jax.tree.map(lambda *x: np.stack(x), *batches), rows=[len(d.strategies) for d in own])


def program_key(arm: Arm, rl: RLConfig) -> tuple | None:
    """What shapes an arm's compiled RL program (`make_runner`'s arguments besides the run's); None: no RL."""
    if not arm.trains:
        return None
    kl = rl.sim_kl_coef if arm.sim_kl_coef is None else arm.sim_kl_coef
    regret = arms_lib.OBJECTIVES[arm.objective].best_response
    return arm.members, kl, arm.start == "selfplay", arm.data_coef, regret


def arm_order(arms: Sequence[Arm], rl: RLConfig) -> list[Arm]:
    """The order the worker threads take arms in: first one arm of each RL program, the program with the
    most arms first (so that the programs compile side by side, each once), then the arms without RL,
    then the rest in the given order."""
    groups: dict[tuple | None, list[Arm]] = {}
    for arm in arms:
        groups.setdefault(program_key(arm, rl), []).append(arm)
    firsts = [group[0] for key, group in sorted(groups.items(), key=lambda item: -len(item[1])) if key]
    rest = groups.get(None, []) + [arm for arm in arms if arm.trains and arm not in firsts]
    return firsts + rest


class CompileOnce:
    """Calls a jitted function through its executable for the arguments' shapes, compiled by the first
    thread that needs it; the others wait for that one instead of compiling it again. (`jit(f).lower(...)
    .compile()` does not fill jit's own cache, so one instance serves the whole process: `COMPILED`.)"""

    def __init__(self):
        self._lock = threading.Lock()
        self._compiled: dict[Any, list] = {}

    def __call__(self, fn: Callable, *args):
        key = (fn, jax.tree.structure(args),
               tuple((np.shape(x), getattr(x, "dtype", None)) for x in jax.tree.leaves(args)))
        with self._lock:
            entry = self._compiled.setdefault(key, [threading.Lock(), None])
        with entry[0]:
            if entry[1] is None:
                entry[1] = fn.lower(*args).compile()
        return entry[1](*args)


COMPILED = CompileOnce()


def log_arm(name: str, result: ArmResult, seeds: Sequence[int], log: Callable) -> None:
    """Every curve point of a finished arm: one record per step, then one per evaluation."""
    per_seed = lambda curves, i: {f"{k}/seed{s}": float(v[r, i]) for k, v in curves.items()
                                  for r, s in enumerate(seeds)}
    steps = result.step_curves["reward"].shape[1] if result.step_curves else 0
    for t in range(steps):
        log(name, t + 1, per_seed(result.step_curves, t))
    for e, step in enumerate(result.eval_steps):
        log(name, int(step), per_seed(result.evals, e))


class ArmStore:
    """Finished arms in the run directory, and their records in metrics.jsonl."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self.folder = run_dir.path / ARMS_DIR
        self.folder.mkdir(exist_ok=True)

    def load(self, name: str) -> ArmResult | None:
        path = self.folder / f"{name}.msgpack"
        if not path.exists():
            return None
        d = _restore(path)
        return ArmResult(str(d["label"]), dict(d["step_curves"] or {}), np.asarray(d["eval_steps"]),
                         dict(d["evals"]), float(d["seconds"]))

    def save(self, name: str, result: ArmResult) -> None:
        if self.run_dir.primary:
            _save(self.folder / f"{name}.msgpack", dataclasses.asdict(result))

    def logged(self, finished: dict[str, ArmResult]) -> set[str]:
        """The finished arms whose records are all in metrics.jsonl; every other arm's records are dropped."""
        records = self.run_dir.read_metrics()
        arm_of = lambda record: next(k for k in record if k != "step").split("/", 1)[0]
        counts: dict[str, int] = {}
        for record in records:
            counts[arm_of(record)] = counts.get(arm_of(record), 0) + 1
        complete = {name for name, result in finished.items() if counts.get(name) == result.records}
        kept = [record for record in records if arm_of(record) in complete]
        if len(kept) < len(records) and self.run_dir.primary:
            (self.run_dir.path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in kept))
        return complete


def run(settings: Settings, run_dir: RunDir, progress: Callable[[str], None] = print) -> Results:
    """The whole experiment; every arm's curve points go to `run_dir.log` (prefix "ARM/")."""
    start = time.perf_counter()
    names = [arm.name for arm in settings.arms]
    if len(set(names)) < len(names):
        raise ValueError(f"arm names repeat: {names}")
    cache = run_dir.path / PRETRAINED
    if cache.exists():
        pre = Pretrained(**_restore(cache))
        progress("pretrained models loaded from the run directory")
    else:
        progress("pretraining agent and simulators")
        needs = list(settings.pretrain_for or settings.arms)
        pre = pretrain(settings.pretrain, settings.seeds, arms_lib.collapse_personas(needs),
                       settings.heldout_seeds, selfplay=any(a.start == "selfplay" for a in needs),
                       say=progress)
        if run_dir.primary:
            _save(cache, pre._asdict())
    seconds = {"pretrain": time.perf_counter() - start}

    graphdef, _ = decoder.init(model_config(settings.pretrain), seed=0)
    tab, panel = Tabulator(graphdef), GradientPanel(graphdef)
    t0 = time.perf_counter()
    # Tabulation reads models out on the threads; the arms, already on threads, with `tab`, one at a time.
    progress("reading out every pretrained model at the 2,551 decision states")
    tables = tabulate(Tabulator(graphdef, settings.workers, progress), pre, settings.vs_samples, settings.seeds)
    diag = pretraining_diagnostics(tables, personas.base_simulator(), settings.pretrain.heldout_priors)
    diag["sft_losses"] = {k: np.asarray(v).tolist() for k, v in pre.losses.items()}
    seconds["tabulate"] = time.perf_counter() - t0
    fitted = None
    if any(arm.data for arm in settings.arms):
        t0 = time.perf_counter()
        fitted = fit(settings, pre, Tabulator(graphdef, settings.workers, progress), graphdef, run_dir, progress)
        seconds["fit"] = time.perf_counter() - t0
        if fitted.temperatures:
            diag["calibrated_temperatures"] = {str(n): t.tolist() for n, t in fitted.temperatures.items()}

    store = ArmStore(run_dir)
    finished = {name: result for name in names if (result := store.load(name)) is not None}
    logged = store.logged(finished)
    log_lock = threading.Lock()

    def log(name: str, result: ArmResult) -> None:
        with log_lock:
            log_arm(name, result, settings.seeds, lambda arm, step, metrics: run_dir.log(step, metrics,
                                                                                         prefix=f"{arm}/"))

    for name, result in finished.items():
        progress(f"arm {name}: finished in the run directory")
        if name not in logged:
            log(name, result)
    keys = jax.random.split(jax.random.key(sum(settings.seeds) + 7919), len(settings.seeds))  # shared by arms
    failed = threading.Event()
    ran: list[float] = []
    queue = collections.deque(arm_order([arm for arm in settings.arms if arm.name not in finished], settings.rl))
    todo = len(queue)

    def worker() -> dict[str, ArmResult]:
        done = {}
        while not failed.is_set():
            try:
                arm = queue.popleft()
            except IndexError:
                break
            try:
                with log_lock:  # print writes the line and its newline separately
                    progress(f"arm {arm.name}")
                done[arm.name] = run_arm(arm, settings, pre, tables, tab, panel, keys, fitted)
            except BaseException:
                failed.set()  # the other threads stop after their current arm
                raise
            store.save(arm.name, done[arm.name])
            log(arm.name, done[arm.name])
            with log_lock:
                ran.append(done[arm.name].seconds)
                left = np.mean(ran) * (todo - len(ran)) / settings.workers
                progress(f"arm {arm.name}: done in {ran[-1]:.0f}s; {len(ran)} of {todo} arms run, "
                         f"about {left:.0f}s left")
        return done

    with ThreadPoolExecutor(settings.workers) as pool:
        futures = [pool.submit(worker) for _ in range(settings.workers)]
        try:
            for future in futures:
                finished |= future.result()
        except KeyboardInterrupt:
            failed.set()
            raise
    results = {name: finished[name] for name in names}
    seconds |= {f"arm/{name}": result.seconds for name, result in results.items()}
    seconds["total"] = time.perf_counter() - start
    return Results(settings, results, diag, evaluate.reference_values(personas.base_simulator()), seconds)
