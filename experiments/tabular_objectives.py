"""The tabular study of simulator objectives that do not see the users:
python -m experiments.tabular_objectives --out DIR (writes DIR/tabular.json and DIR/tabular.md).

Co-training in the exact tabular game (`testbed.tabular`) from the untrained agent and the collapsed
simulator, per simulator objective (adversarial, cooperative, regret against the exact best response,
adversarial with an entropy bonus) at every KL weight x simulator learning rate of the grid, against the
two controls (the simulator frozen at the collapsed one, and at the base one: the population), on the
same seeds. The protocol, stated before the run (docs/results/README.md):

- the agent: Adam at AGENT_LEARNING_RATE for `steps` steps, chosen by the rule: the smallest multiple of
  STEP_UNIT steps after which the frozen collapsed control's training value stays within TOLERANCE of
  its value at PROBE_STEPS, for every seed;
- the grid: KL_COEFS x SIM_LEARNING_RATES per objective, SEEDS (a seed perturbs the agent's initial
  logits by SEED_NOISE x N(0, 1): everything else is exact);
- the held-out value: the final agent's exact value on the population (the base simulator); every arm
  is compared with the frozen collapsed control, paired by seed (95% t-intervals).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.envs import personas
from scope_jax.testbed import prose, statistics, tabular
from scope_jax.testbed.progress import Ticker

AGENT_LEARNING_RATE = 0.1
PROBE_STEPS, STEP_UNIT, TOLERANCE = 1000, 50, 1e-3
KL_COEFS = (0.0, 1.0, 4.0)
SIM_LEARNING_RATES = (0.01, 0.1, 1.0)
SEEDS = (0, 1, 2, 3, 4)
SEED_NOISE = 0.1
LABELS = {"adversarial": "adversarial", "cooperative": "cooperative",
          "regret": "regret (exact best response)",
          "adversarial_entropy": f"adversarial + entropy bonus "
                                 f"{tabular.OBJECTIVES['adversarial_entropy'].entropy_coef:g}"}
STEP_RULE = (f"the smallest multiple of {STEP_UNIT} steps after which the frozen collapsed control's "
             f"training value stays within {TOLERANCE:g} of its value at {PROBE_STEPS} steps, for every seed")
CONTROL, BASE_CONTROL = "frozen", "frozen_base"


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    label: str
    objective: str  # a key of tabular.OBJECTIVES (frozen arms: adversarial, which a rate of 0 ignores)
    kl_coef: float
    sim_learning_rate: float  # 0: frozen
    start: str  # "collapsed" or "base"


def study_arms() -> tuple[Arm, ...]:
    controls = (Arm(CONTROL, "frozen collapsed simulator", "adversarial", 0.0, 0.0, "collapsed"),
                Arm(BASE_CONTROL, "frozen base simulator", "adversarial", 0.0, 0.0, "base"))
    return controls + tuple(
        Arm(f"{objective}_kl{kl:g}_lr{lr:g}", f"{LABELS[objective]}, KL {kl:g}, simulator lr {lr:g}",
            objective, kl, lr, "collapsed")
        for objective in tabular.OBJECTIVES for kl in KL_COEFS for lr in SIM_LEARNING_RATES)


def starts() -> dict[str, np.ndarray]:
    return {"collapsed": tabular.sim_logits(personas.collapsed_simulator()),
            "base": tabular.sim_logits(personas.base_simulator())}


def train(arms: tuple[Arm, ...], steps: int, say: Callable[[str], None],
          label: str) -> tuple[tabular.Outcome, np.ndarray]:
    """Every arm x seed for `steps` steps (vmapped, in chunks of STEP_UNIT with progress lines): the final
    outcomes [arms x seeds] and the training values before each step [arms x seeds, steps]."""
    logits = starts()
    settings = [tabular.members(tabular.setting(tabular.OBJECTIVES[a.objective], a.kl_coef,
                                                a.sim_learning_rate, logits[a.start]))
                for a in arms for _ in SEEDS]
    batch = jax.tree.map(lambda *x: jnp.stack(x), *settings)
    agents = jnp.stack([jnp.asarray(tabular.initial_agent(seed, SEED_NOISE)) for _ in arms for seed in SEEDS])
    state = jax.jit(jax.vmap(tabular.init))(agents, batch)
    chunk = jax.jit(jax.vmap(lambda st, s: tabular.train(st, s, AGENT_LEARNING_RATE, STEP_UNIT)))
    tick, values = Ticker(f"{label}: steps", steps, say), []
    for done in range(STEP_UNIT, steps + 1, STEP_UNIT):
        state, log = chunk(state, batch)
        values.append(np.asarray(log.train_value))
        tick(done)
    outcome = jax.jit(jax.vmap(tabular.outcome, (0, 0, None)))(state, batch, jnp.asarray(logits["base"]))
    return outcome, np.concatenate(values, axis=1)


def choose_steps(values: np.ndarray, final: np.ndarray) -> int:
    """The rule: values [R, PROBE_STEPS] (value after t steps at t), final [R] (after PROBE_STEPS)."""
    curve = np.concatenate([values, final[:, None]], axis=1)
    settled = np.abs(curve - final[:, None]).max(0) < TOLERANCE  # [PROBE_STEPS + 1]
    for t in range(STEP_UNIT, PROBE_STEPS, STEP_UNIT):  # at PROBE_STEPS itself it trivially is
        if settled[t:].all():
            return t
    raise ValueError(f"the frozen collapsed control does not settle within {PROBE_STEPS} steps")


METRICS = ("heldout_value", "train_value", "sim_deviation", "sim_kl_to_start")


def run(say: Callable[[str], None] = print) -> dict[str, Any]:
    start = time.perf_counter()
    control = tuple(a for a in study_arms() if a.name == CONTROL)
    probe, curve = train(control, PROBE_STEPS, say, "probe (frozen collapsed)")
    steps = choose_steps(curve, np.asarray(probe.train_value))
    say(f"the rule chooses {steps} steps")
    arms = study_arms()
    outcome = train(arms, steps, say, f"{len(arms)} arms x {len(SEEDS)} seeds")[0]
    per_arm = {k: np.asarray(getattr(outcome, k), np.float64).reshape(len(arms), len(SEEDS)) for k in METRICS}
    index = {a.name: i for i, a in enumerate(arms)}
    heldout = per_arm["heldout_value"]
    base = starts()["base"]
    untrained = [float(tabular.value(tabular.initial_agent(s, SEED_NOISE), base)) for s in SEEDS]
    return {
        "protocol": {"agent_learning_rate": AGENT_LEARNING_RATE,
                     "optimizer": "Adam (optax defaults), both players",
                     "step_rule": STEP_RULE, "kl_coefs": KL_COEFS, "sim_learning_rates": SIM_LEARNING_RATES,
                     "seed_noise": SEED_NOISE, "ask_floor": tabular.ASK_FLOOR,
                     "entropy_coef": tabular.OBJECTIVES["adversarial_entropy"].entropy_coef},
        "steps": steps,
        "seeds": list(SEEDS),
        "untrained": {"heldout_value": statistics._stat(untrained)},
        "arms": {a.name: {"label": a.label, "objective": a.objective, "kl": a.kl_coef,
                          "lr": a.sim_learning_rate,
                          "start": a.start, **{k: statistics._stat(per_arm[k][index[a.name]]) for k in METRICS}}
                 for a in arms},
        "deltas": {a.name: {"heldout_value": statistics._stat(heldout[index[a.name]] - heldout[index[CONTROL]])}
                   for a in arms if a.sim_learning_rate > 0},
        "frozen_base_gap": statistics._stat(heldout[index[BASE_CONTROL]] - heldout[index[CONTROL]]),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _fmt(stat: dict[str, Any]) -> str:
    return prose.fmt(statistics._pair(stat))


def _cell(summary: dict[str, Any], name: str, key: str) -> str:
    return _fmt(summary["arms"][name][key])


# The table: rows of (header, cell of arm `name` in `summary`).
COLUMNS: tuple[tuple[str, Callable[[dict, str], str]], ...] = (
    ("arm", lambda s, n: s["arms"][n]["label"]),
    ("held-out value", lambda s, n: _cell(s, n, "heldout_value")),
    ("- frozen collapsed",
     lambda s, n: prose.signed(s["deltas"][n]["heldout_value"]) if n in s["deltas"] else "-"),
    ("verdict", lambda s, n: statistics.direction(s["deltas"][n]["heldout_value"]) if n in s["deltas"] else "-"),
    ("training value", lambda s, n: _cell(s, n, "train_value")),
    ("simulator deviation", lambda s, n: _cell(s, n, "sim_deviation")),
    ("simulator KL to start", lambda s, n: _cell(s, n, "sim_kl_to_start")),
)


def markdown(summary: dict[str, Any]) -> str:
    rows = [[cell(summary, name) for _, cell in COLUMNS] for name in summary["arms"]]
    protocol = summary["protocol"]
    return "\n".join([
        "# Simulator objectives in the tabular game (exact gradients)", "",
        f"Written by `python -m experiments.tabular_objectives` in {summary['wall_s']:.0f} s. "
        f"{len(summary['seeds'])} seeds (a seed perturbs the agent's initial logits by "
        f"{protocol['seed_noise']:g} x N(0, 1)); {summary['steps']} steps of {protocol['optimizer']}, "
        f"the agent at rate {protocol['agent_learning_rate']:g}, the steps chosen by the rule: "
        f"{protocol['step_rule']}. "
        "Held-out value: the final agent's exact value on the population; differences from the frozen "
        "collapsed simulator are paired by seed, with 95% t-intervals.", "",
        f"Untrained agent: held-out value {_fmt(summary['untrained']['heldout_value'])}. "
        f"Frozen base minus frozen collapsed: {prose.signed(summary['frozen_base_gap'])}.", "",
        *prose._table([c for c, _ in COLUMNS], rows), "",
        tabular_null_sentence(summary), ""])


def tabular_null_sentence(summary: dict[str, Any]) -> str:
    """The tabular study's verdict per objective against the frozen collapsed simulator, paired by seed
    (from tabular.json alone)."""
    by_objective: dict[str, list[dict[str, Any]]] = {}
    for name, delta in summary["deltas"].items():
        by_objective.setdefault(LABELS[summary["arms"][name]["objective"]], []).append(delta["heldout_value"])
    gap = summary["frozen_base_gap"]
    largest = max(0.0, *(d["heldout_value"]["mean"] for d in summary["deltas"].values()))
    return (f"Simulator objectives that do not see the users, tabular evidence (`python -m "
            f"experiments.tabular_objectives`, exact gradients, KL weight x simulator learning rate, "
            f"{len(summary['seeds'])} seeds): {prose.objective_verdicts(by_objective)}; the frozen base "
            f"simulator is {prose.signed(gap)} above the frozen collapsed one, and the largest difference "
            f"above is {largest / gap['mean']:.0%} of that gap.")


def command(doc: str, name: str, study: Callable[[], dict[str, Any]],
            write_markdown: Callable[[dict[str, Any]], str]) -> None:
    """A tabular study's command line: --out DIR, then DIR/NAME.json and DIR/NAME.md from `study()`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help=f"folder for {name}.json and {name}.md")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    summary = study()
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"{name}.md").write_text(write_markdown(summary))
    print(f"wrote {out / f'{name}.json'} and {out / f'{name}.md'} in {summary['wall_s']:.0f} s")


def main() -> None:
    command(__doc__, "tabular", run, markdown)


if __name__ == "__main__":
    main()
