"""Scarce user data: what beats the fitted simulator (issue 33; protocol in docs/results/README.md).

From summary.json's arms alone (`curve`), so the README can be written from it: per N the arms of
`arms.scarce_arms`, each against fitted at the same N, paired by seed (beats fitted / indistinguishable
/ worse at 95%), with the regret each ends with (against its training simulators and against the
users) and its held-out NLL; the frozen collapsed (N = 0) and frozen base (N = infinity) simulators
as the two ends. The figure and the table are the data curve's (`data_report`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scope_jax.testbed import data_report
from scope_jax.testbed.experiment import Results
from scope_jax.testbed.prose import fmt, signed, table_lines
from scope_jax.testbed.report import Section
from scope_jax.testbed.statistics import direction, mean_ci, seed_stat

KINDS = {"fitted": "fitted", "calibrated": "fitted, calibrated",
         "fitted_population": "fitted population (P=4)", "regret_data": "regret + data",
         "population_regret_data": "population regret + data"}
COLORS = {"fitted": "tab:green", "calibrated": "tab:olive", "fitted_population": "tab:blue",
          "regret_data": "tab:purple", "population_regret_data": "tab:orange"}
METRICS = ("heldout_value", "data_nll", "regret_train", "regret_users", "train_value")
VERDICTS = {"higher": "beats fitted", "lower": "is worse than fitted"}


def verdict(stat: dict[str, Any]) -> str:
    """Beats fitted / is worse / is indistinguishable, by the paired 95% interval."""
    return VERDICTS.get(direction(stat), "is indistinguishable from fitted")


def curve(summary: dict[str, Any], sizes: list[int], data_coef: float) -> dict[str, Any]:
    """Per N: each kind's final numbers and its paired difference from fitted's held-out value."""
    arms = summary["arms"]
    rows = {}
    for n in sizes:
        names = {kind: f"{kind}_n{n}" for kind in KINDS}
        fitted = np.asarray(arms[names["fitted"]]["heldout_value"]["seeds"])
        rows[str(n)] = {"arms": names,
                        **{m: {k: arms[name][m] for k, name in names.items()} for m in METRICS},
                        "vs_fitted": {k: seed_stat(np.asarray(arms[name]["heldout_value"]["seeds"]) - fitted)
                                      for k, name in names.items() if k != "fitted"},
                        "data_coef": data_coef}
    controls = {c: arms[c]["heldout_value"] for c in ("frozen", "frozen_base") if c in arms}
    return {"sizes": sizes, "data_coef": data_coef, "by_n": rows, "controls": controls,
            "temperatures": summary["pretraining"].get("calibrated_temperatures", {})}


def sentences(data: dict[str, Any]) -> list[str]:
    """Where fitted stands between the controls, then one sentence per arm: its verdict at each N."""
    lines = []
    fitted = {n: data["by_n"][str(n)]["heldout_value"]["fitted"] for n in data["sizes"]}
    if len(data["controls"]) == 2:
        low, high = data["controls"]["frozen"]["mean"], data["controls"]["frozen_base"]["mean"]
        share = lambda stat: (stat["mean"] - low) / (high - low)
        path = ", ".join(f"{fmt(mean_ci(fitted[n]))} at N = {n} ({share(fitted[n]):.0%} of the gap)"
                         for n in data["sizes"])
        lines.append(f"The fitted simulator's held-out value is {path}, between the frozen collapsed "
                     f"simulator's {low:.3f} (N = 0) and the frozen base simulator's {high:.3f} (N = ∞).")
    for kind, label in KINDS.items():
        if kind == "fitted":
            continue
        parts = "; ".join(f"at N = {n} it {verdict(d)} ({signed(d)})"
                          for n in data["sizes"] for d in (data["by_n"][str(n)]["vs_fitted"][kind],))
        lines.append(f"**{label}** against fitted, paired by seed: {parts}.")
    return lines


def regret_table(data: dict[str, Any]) -> list[str]:
    rows = [[str(n), label, *(fmt(mean_ci(data["by_n"][str(n)][m][kind]))
                              for m in ("regret_train", "regret_users", "train_value"))]
            for n in data["sizes"] for kind, label in KINDS.items()]
    return table_lines(["N", "arm", "regret vs its training simulators", "regret vs the users",
                               "training value"], rows)


def readme_lines(data: dict[str, Any]) -> list[str]:
    """The README's scarce-data verdicts (from scarce.json alone)."""
    seeds = len(data["by_n"][str(data["sizes"][0])]["heldout_value"]["fitted"]["seeds"])
    return [f"Scarce user data (`:scarce`, docs/results/scarce.md, {seeds} seeds, each arm against fitted "
            "at the same N, paired by seed, 95%):", "",
            *[f"- {x}" for x in sentences(data)]]


def markdown(data: dict[str, Any]) -> list[str]:
    temperatures = "; ".join(f"N = {n}: {', '.join(f'{t:g}' for t in ts)}"
                             for n, ts in data["temperatures"].items())
    return ["## Scarce user data: what beats the fitted simulator", "",
            "![scarce curve](figures/scarce_curve.png)", "",
            "Protocol (docs/results/README.md, stated before the run): data anchor weight "
            f"{data['data_coef']:g}, P = 4, the best response solved every `rl.best_response_every` steps; "
            "verdicts by the paired 95% t-interval of the difference from fitted. Calibrated temperatures "
            "per seed: "
            f"{temperatures or '-'}.", "",
            *[f"- {x}" for x in sentences(data)], "",
            *data_report.table(data, KINDS), "",
            "Regret at the end, V(best response, q) - V(agent, q) (exact), against the arm's training "
            "simulators (mean over members) and against the users:", "", *regret_table(data), ""]


def summarize(results: Results, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The scarce-data curve of a run with the scarce arms (None without)."""
    sizes = sorted({arm.data for arm in results.settings.arms if arm.start == "fitted_calibrated"})
    if not sizes:
        return None
    coef = next(arm.data_coef for arm in results.settings.arms if arm.name == f"regret_data_n{sizes[0]}")
    return curve(summary, sizes, coef)


SECTION = Section("scarce_curve", summarize,
                  lambda data, labels: data_report.figure(data, labels, KINDS, COLORS), markdown)
