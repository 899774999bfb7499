"""The simulator-collapse experiment: pretrain, tabulate, run every arm on the same seeds, evaluate exactly.

`run` returns plain numpy results (curves per arm and seed, pretraining diagnostics, exact references,
wall times); `scope_jax.testbed.report` turns them into figures and summaries.

Arms run on `Settings.workers` threads, which take them in `arm_order` and compile each RL program
once (`CompileOnce`): XLA:CPU runs this game's tiny programs on about one core each, so a second
thread nearly doubles the arms' throughput on two cores. No arm's numbers depend on it.

With data arms (`Settings.data`), the user dialogues are drawn and the simulators fitted to them
(`testbed.fitting`) after tabulation (`testbed.tabulation`); the fitted models are kept in
`fitted.msgpack`.

The run directory keeps what is done: the pretrained models (`pretrained.msgpack`) and every finished
arm (`testbed.arm_store`, written before its metrics are logged). A resumed run loads both and reruns
only the arms that did not finish.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from scope_jax import diagnostics
from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.testbed import arms as arms_lib
from scope_jax.testbed import evaluate, user_data
from scope_jax.testbed.arm_store import ArmResult, ArmStore, log_arm, restore_tree, save_tree
from scope_jax.testbed.arms import FITTED_STARTS, Arm
from scope_jax.testbed.fitting import POPULATION, Fitter, fit_to_data, tempered
from scope_jax.testbed.gradients import GradientPanel
from scope_jax.testbed.pretrain import Pretrained, PretrainConfig, model_config, pretrain
from scope_jax.testbed.rl import RLConfig, arm_inputs, make_runner
from scope_jax.testbed.tabulation import Tables, Tabulator, pretraining_diagnostics, tabulate
from scope_jax.training.run_dir import RunDir
from scope_jax.training.state import leaves_at

PRETRAINED = "pretrained.msgpack"
FITTED = "fitted.msgpack"


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
class Results:
    settings: Settings
    arms: dict[str, ArmResult]
    pretraining: dict[str, Any]
    references: dict[str, dict[str, float]]
    seconds: dict[str, float]


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
    if cache.exists() and set(fits) <= set(cached := restore_tree(cache)):
        params = {start: {int(n): p for n, p in cached[start].items() if int(n) in config.sizes}
                  for start in fits}
        progress("fitted simulators loaded from the run directory")
    else:
        fitter = Fitter(graphdef, config.fit_learning_rate)
        params = fit_to_data(fitter, pre.collapsed, dialogues, config, fits, progress)
        if run_dir.primary:
            save_tree(cache, {start: {str(n): p for n, p in by_n.items()} for start, by_n in params.items()})
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
    agent_params = lambda r, e: leaves_at(agent0, r)
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
        agent_params = lambda r, e: leaves_at(agent0, r) if e == 0 else leaves_at(snaps.agent, (r, e - 1))
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


def run(settings: Settings, run_dir: RunDir, progress: Callable[[str], None] = print) -> Results:
    """The whole experiment; every arm's curve points go to `run_dir.log` (prefix "ARM/")."""
    start = time.perf_counter()
    names = [arm.name for arm in settings.arms]
    if len(set(names)) < len(names):
        raise ValueError(f"arm names repeat: {names}")
    cache = run_dir.path / PRETRAINED
    if cache.exists():
        pre = Pretrained(**restore_tree(cache))
        progress("pretrained models loaded from the run directory")
    else:
        progress("pretraining agent and simulators")
        needs = list(settings.pretrain_for or settings.arms)
        pre = pretrain(settings.pretrain, settings.seeds, arms_lib.collapse_personas(needs),
                       settings.heldout_seeds, selfplay=any(a.start == "selfplay" for a in needs),
                       say=progress)
        if run_dir.primary:
            save_tree(cache, pre._asdict())
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
