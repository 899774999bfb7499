"""The tabular counterpart of `:scarce`: python -m experiments.tabular_scarce --out DIR (writes
DIR/tabular_scarce.json and DIR/tabular_scarce.md).

What beats the fitted simulator when user data are scarce, in the exact tabular game (`testbed.tabular`,
exact gradients). Per seed s its own user dialogues (the first N of MAX_DIALOGUES drawn from DATA_SEED
+ s by the untrained agent with the population, the last tenth held out) and a perturbation of the
agent's start. At every N of SIZES, against the two controls (the simulator frozen at the collapsed one
and at the base one), the arms of the protocol (docs/results/README.md, stated before the run):

- fitted: the Dirichlet posterior mean of the reply counts, prior weight x the collapsed simulator
  (the weight chosen on the held-out tenth), frozen;
- calibrated: fitted at the temperature chosen on the held-out tenth (`user_data.calibrate`), frozen;
- population: MEMBERS posterior samples, the agent against their mixture, frozen;
- regret + data at each weight of DATA_COEFS (the simulator from fitted ascends its regret minus the
  weight x the NLL of the fitted part; the rule `DATA_RULE` picks one weight per N);
- population regret + data: the samples, member p on its own bootstrap resample of the fitted part,
  at the weight the rule chose.

Every arm against fitted at the same N, paired by seed, 95% t-intervals.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import tabular_objectives
from scope_jax.envs import personas
from scope_jax.testbed import prose, statistics, tabular, user_data
from scope_jax.testbed.progress import Ticker

SIZES = (10, 30, 100, 1000)
SEEDS = tuple(range(20))
DATA_SEED, MAX_DIALOGUES = 20261203, 1000
STEPS, AGENT_LEARNING_RATE, SIM_LEARNING_RATE, SEED_NOISE = 100, 0.1, 0.1, 0.1
DATA_COEFS = (0.3, 1.0, 3.0, 10.0)
MEMBERS = 4
NLL_TOLERANCE = 0.10
DATA_RULE = (f"the smallest weight whose regret + data simulator ends with a held-out-tenth NLL (mean over "
             f"seeds) within {NLL_TOLERANCE:.0%} of the fitted simulator's; the largest when none is")
KINDS = {"fitted": "fitted", "calibrated": "fitted, calibrated",
         "population": f"fitted population (P={MEMBERS})", "regret_data": "regret + data",
         "population_regret_data": "population regret + data"}
METRICS = ("heldout_value", "train_value", "regret_train", "regret_users", "heldout_nll", "sim_deviation")
REGRET = tabular.OBJECTIVES["regret"]
FROZEN = tabular.OBJECTIVES["adversarial"]  # a rate of 0 ignores the objective


@dataclasses.dataclass(frozen=True)
class Data:
    """One seed's user data at one N, as the arms see it."""

    counts: np.ndarray  # reply counts of the fitted part
    heldout: user_data.Dialogues
    heldout_counts: np.ndarray
    resamples: np.ndarray  # [MEMBERS, ...] reply counts of each member's bootstrap resample
    fitted: np.ndarray  # the posterior mean
    temperature: float
    samples: np.ndarray  # [MEMBERS, ...] posterior samples
    prior_weight: float


def user_dialogues(seed: int) -> user_data.Dialogues:
    return user_data.draw(user_data.DataConfig(sizes=(MAX_DIALOGUES,), seed=DATA_SEED + seed))


def seed_data(dialogues: user_data.Dialogues, seed: int, n: int) -> Data:
    part = user_data.split(dialogues, n, 0.1)
    counts = user_data.reply_counts(part.train)
    prior = personas.collapsed_simulator()
    weight = tabular.fit_prior_weight(counts, prior, part.heldout)
    fitted = tabular.posterior_mean(counts, prior, weight)
    resamples = np.stack([user_data.reply_counts(user_data.bootstrap(part.train, (DATA_SEED, seed, n, p)))
                          for p in range(MEMBERS)])
    return Data(counts, part.heldout, user_data.reply_counts(part.heldout), resamples, fitted,
                user_data.calibrate(fitted, part.heldout),
                tabular.posterior_samples(counts, prior, weight, MEMBERS, (DATA_SEED, seed, n)), weight)


def logits(table: np.ndarray) -> np.ndarray:
    return np.log(table).astype(np.float32)


def run_batch(runs: list[tuple[tabular.Setting, jax.Array, np.ndarray]],
              sims_train: bool) -> dict[str, np.ndarray]:
    """runs: (members' settings, agent start, held-out counts), all with the same number of members.
    Every run for STEPS steps (one vmapped call); the outcomes [runs] per metric."""
    settings = jax.tree.map(lambda *x: jnp.stack(x), *(r[0] for r in runs))
    agents = jnp.stack([r[1] for r in runs])
    heldout = jnp.asarray(np.stack([r[2] for r in runs]), jnp.float32)
    fn = _compiled(sims_train)
    out = fn(agents, settings, heldout)
    return {k: np.asarray(getattr(out, k), np.float64) for k in METRICS}


_CACHE: dict[bool, Callable] = {}


def _compiled(sims_train: bool) -> Callable:
    if sims_train not in _CACHE:
        base = jnp.asarray(logits(personas.base_simulator()))

        def one(agent, s, heldout):
            state, _ = tabular.train(tabular.init(agent, s), s, AGENT_LEARNING_RATE, STEPS, sims_train)
            return tabular.outcome(state, s, base, heldout)

        _CACHE[sims_train] = jax.jit(jax.vmap(one))
    return _CACHE[sims_train]


def frozen(tables: np.ndarray) -> tabular.Setting:
    return tabular.members(*(tabular.setting(FROZEN, 0.0, 0.0, logits(q)) for q in tables))


def regret_data(starts: np.ndarray, counts: np.ndarray, coef: float) -> tabular.Setting:
    return tabular.members(*(tabular.setting(REGRET, 0.0, SIM_LEARNING_RATE, logits(q), coef, c)
                             for q, c in zip(starts, counts)))


def choose_coef(nll: dict[float, np.ndarray], fitted_nll: np.ndarray) -> float:
    """DATA_RULE: nll {weight: [seeds]} of the regret + data simulators, fitted_nll [seeds]."""
    within = [c for c in sorted(nll) if nll[c].mean() <= (1 + NLL_TOLERANCE) * fitted_nll.mean()]
    return within[0] if within else max(nll)


def run(say: Callable[[str], None] = print) -> dict[str, Any]:
    start = time.perf_counter()
    agents = [jnp.asarray(tabular.initial_agent(s, SEED_NOISE)) for s in SEEDS]
    dialogues = [user_dialogues(s) for s in SEEDS]
    no_counts = np.zeros(tabular.SIM_SHAPE, np.float32)
    ends = (personas.collapsed_simulator(), personas.base_simulator())
    controls = run_batch([(frozen(table[None]), agents[r], no_counts)
                          for table in ends for r in range(len(SEEDS))], sims_train=False)
    per_control = {k: v.reshape(2, len(SEEDS)) for k, v in controls.items()}
    out: dict[str, Any] = {"controls": {name: {k: statistics._stat(per_control[k][i]) for k in METRICS}
                                        for i, name in enumerate(("frozen", "frozen_base"))}, "by_n": {}}
    tick = Ticker("tabular scarce: sizes", len(SIZES), say, every=0.0)
    for done, n in enumerate(SIZES, 1):
        data = [seed_data(dialogues[r], s, n) for r, s in enumerate(SEEDS)]
        R = len(SEEDS)
        single = run_batch([(frozen(table[None]), agents[r], d.heldout_counts) for table_of in
                            (lambda d: d.fitted, lambda d: user_data.temper(d.fitted, d.temperature))
                            for r, d in enumerate(data) for table in (table_of(d),)], sims_train=False)
        fitted = {k: v[:R] for k, v in single.items()}
        calibrated = {k: v[R:] for k, v in single.items()}
        regret = run_batch([(regret_data(d.fitted[None], d.counts[None], c), agents[r], d.heldout_counts)
                            for c in DATA_COEFS for r, d in enumerate(data)], sims_train=True)
        by_coef = {c: {k: v[i * R:(i + 1) * R] for k, v in regret.items()} for i, c in enumerate(DATA_COEFS)}
        coef = choose_coef({c: m["heldout_nll"] for c, m in by_coef.items()}, fitted["heldout_nll"])
        population = run_batch([(frozen(d.samples), agents[r], d.heldout_counts) for r, d in enumerate(data)],
                               sims_train=False)
        population_regret = run_batch([(regret_data(d.samples, d.resamples, coef), agents[r],
                                        d.heldout_counts) for r, d in enumerate(data)], sims_train=True)
        arms = {"fitted": fitted, "calibrated": calibrated, "population": population,
                "regret_data": by_coef[coef], "population_regret_data": population_regret}
        stats = lambda m: {k: statistics._stat(m[k]) for k in METRICS}
        out["by_n"][str(n)] = {
            "data_coef": coef,
            "prior_weight": [d.prior_weight for d in data], "temperature": [d.temperature for d in data],
            "arms": {kind: stats(m) for kind, m in arms.items()},
            "vs_fitted": {kind: statistics._stat(m["heldout_value"] - fitted["heldout_value"])
                          for kind, m in arms.items() if kind != "fitted"},
            "regret_data_by_coef": {f"{c:g}": stats(m) for c, m in by_coef.items()},
        }
        tick(done)
    out |= {"protocol": {"sizes": SIZES, "seeds": list(SEEDS), "steps": STEPS,
                         "agent_learning_rate": AGENT_LEARNING_RATE, "sim_learning_rate": SIM_LEARNING_RATE,
                         "seed_noise": SEED_NOISE, "data_coefs": DATA_COEFS, "data_rule": DATA_RULE,
                         "members": MEMBERS, "prior_weights": tabular.PRIOR_WEIGHTS,
                         "temperatures": user_data.TEMPERATURES},
            "wall_s": round(time.perf_counter() - start, 1)}
    return out


def _verdict(stat: dict[str, Any]) -> str:
    return {"higher": "beats fitted", "lower": "worse than fitted"}.get(statistics.direction(stat),
                                                                        "indistinguishable from fitted")


def table(summary: dict[str, Any]) -> list[str]:
    rows = []
    for n in summary["protocol"]["sizes"]:
        row = summary["by_n"][str(n)]
        for kind, label in KINDS.items():
            arm, delta = row["arms"][kind], row["vs_fitted"].get(kind)
            rows.append([str(n), label + (f" (weight {row['data_coef']:g})" if "regret" in kind else ""),
                         prose.fmt(statistics._pair(arm["heldout_value"])),
                         prose.fmt(statistics._pair(delta)) if delta else "-", _verdict(delta) if delta else "-",
                         *(prose.fmt(statistics._pair(arm[k])) for k in ("regret_train", "regret_users",
                                                                        "heldout_nll"))])
    return prose._table(["N", "arm", "held-out value", "Δ vs fitted (paired)", "verdict",
                          "regret (training sims)", "regret (users)", "held-out NLL"], rows)


def sentences(summary: dict[str, Any]) -> list[str]:
    """One per arm: its verdict against fitted at every N (from tabular_scarce.json alone)."""
    sizes = summary["protocol"]["sizes"]
    out = []
    for kind, label in KINDS.items():
        if kind == "fitted":
            fitted = lambda n: summary["by_n"][str(n)]["arms"]["fitted"]["heldout_value"]
            path = ", ".join(f"{fitted(n)['mean']:.3f} at N = {n}" for n in sizes)
            low, high = (summary["controls"][c]["heldout_value"]["mean"] for c in ("frozen", "frozen_base"))
            out.append(f"**fitted** (Dirichlet posterior mean): held-out value {path}, between the frozen "
                       f"collapsed simulator's {low:.3f} and the frozen base simulator's {high:.3f}.")
            continue
        parts = "; ".join(f"N = {n}: {prose.signed(summary['by_n'][str(n)]['vs_fitted'][kind])}, "
                          f"{_verdict(summary['by_n'][str(n)]['vs_fitted'][kind])}" for n in sizes)
        out.append(f"**{label}** against fitted, paired by seed: {parts}.")
    return out


def readme_lines(summary: dict[str, Any]) -> list[str]:
    """The README's tabular scarce-data verdicts (from tabular_scarce.json alone)."""
    seeds = len(summary["protocol"]["seeds"])
    return ["Its tabular counterpart (`python -m experiments.tabular_scarce`, docs/results/tabular_scarce.md, "
            f"exact gradients, {seeds} seeds, each with its own user dialogues):", "",
            *[f"- {x}" for x in sentences(summary)]]


def markdown(summary: dict[str, Any]) -> str:
    p = summary["protocol"]
    coefs = ", ".join(f"{summary['by_n'][str(n)]['data_coef']:g} at N = {n}" for n in p["sizes"])
    return "\n".join([
        "# Scarce user data in the tabular game (exact gradients)", "",
        f"Written by `python -m experiments.tabular_scarce` in {summary['wall_s']:.0f} s. "
        f"{len(p['seeds'])} seeds (each its own user dialogues and a perturbation of the agent's start by "
        f"{p['seed_noise']:g} x N(0, 1)); {p['steps']} steps of Adam, agent at {p['agent_learning_rate']:g}, "
        f"trained simulators at {p['sim_learning_rate']:g}. Protocol: docs/results/README.md. Held-out "
        "value: the final agent's exact value on the population; differences from fitted are paired by "
        "seed, with 95% t-intervals. Regret: "
        "V(best response, q) - V(agent, q), against the training simulators (mean over members) and against "
        "the users (the base simulator).", "",
        f"Data weight rule: {p['data_rule']}; chosen: {coefs}.", "",
        *[f"- {x}" for x in sentences(summary)], "", *table(summary), ""])


def main() -> None:
    tabular_objectives.command(__doc__, "tabular_scarce", run, markdown)


if __name__ == "__main__":
    main()
