"""The data curve: held-out value against the number N of user dialogues the simulators see.

From summary.json's arms alone (`curve`), so the README can be written from it: per N the fitted
simulator (the control), Verbalized Sampling fitted, and Co-Training with the data anchor at the weight
the stated rule picks (`ANCHOR_RULE`); each against fitted at the same N, paired by seed; the frozen
collapsed (N = 0) and frozen base (N = infinity) simulators as the two ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scope_jax.testbed.arms import Arm
from scope_jax.testbed.experiment import Results
from scope_jax.testbed.figures import plt
from scope_jax.testbed.prose import fmt, signed, table_lines
from scope_jax.testbed.report import Section
from scope_jax.testbed.statistics import direction, mean_ci, seed_stat

ANCHOR_RULE = ("the smallest data weight whose co-trained simulator ends with an NLL on the held-out tenth "
               "of the N dialogues (mean over seeds) within {tolerance:.0%} of the fitted simulator's; the "
               "largest weight when none is")
KINDS = {"fitted": "fitted", "vs_fitted": "Verbalized Sampling, fitted",
         "cotrain_data": "Co-Training with a data anchor"}
COLORS = {"fitted": "tab:green", "vs_fitted": "tab:blue", "cotrain_data": "tab:purple"}


def anchor_choice(arms: dict[str, Any], points: dict[str, dict], n: int, tolerance: float) -> str:
    """The co-trained arm at N that `ANCHOR_RULE` picks (by held-out NLL only: no population data)."""
    fitted = arms[f"fitted_n{n}"]["data_nll"]["mean"]
    candidates = sorted((p["data_coef"], name) for name, p in points.items()
                        if p["kind"] == "cotrain_data" and p["n"] == n)
    within = [name for coef, name in candidates if arms[name]["data_nll"]["mean"] <= (1 + tolerance) * fitted]
    return within[0] if within else candidates[-1][1]


def curve(summary: dict[str, Any], points: dict[str, dict], tolerance: float) -> dict[str, Any]:
    """points: {arm name: {"kind", "n", "data_coef"}} of the data arms. Per N: the rule's choice and
    each kind's arm, its held-out value and its paired difference from fitted at the same N."""
    arms = summary["arms"]
    sizes = sorted({p["n"] for p in points.values()})
    rows = {}
    for n in sizes:
        chosen = anchor_choice(arms, points, n, tolerance)
        names = {"fitted": f"fitted_n{n}", "vs_fitted": f"vs_fitted_n{n}", "cotrain_data": chosen}
        fitted = np.asarray(arms[names["fitted"]]["heldout_value"]["seeds"])
        rows[str(n)] = {
            "arms": names, "data_coef": points[chosen]["data_coef"],
            "heldout_value": {k: arms[name]["heldout_value"] for k, name in names.items()},
            "data_nll": {k: arms[name]["data_nll"] for k, name in names.items()},
            "vs_fitted": {k: seed_stat(np.asarray(arms[name]["heldout_value"]["seeds"]) - fitted)
                          for k, name in names.items() if k != "fitted"},
        }
    controls = {c: arms[c]["heldout_value"] for c in ("frozen", "frozen_base") if c in arms}
    return {"sizes": sizes, "rule": ANCHOR_RULE.format(tolerance=tolerance), "tolerance": tolerance,
            "points": points, "by_n": rows, "controls": controls}


def figure(data: dict[str, Any], labels: dict[str, str], kinds: dict[str, str] = KINDS,
           colors: dict[str, str] = COLORS):
    """Held-out value against N: each kind of `kinds` with its 95% intervals, between the controls."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sizes = np.asarray(data["sizes"], float)
    for (name, style), color in zip((("frozen", "--"), ("frozen_base", "-.")), ("tab:red", "k")):
        if name in data["controls"]:
            mean, hw = mean_ci(data["controls"][name])
            end = "0" if name == "frozen" else "∞"
            ax.axhline(mean, color=color, ls=style, lw=1.2, label=f"{labels[name]} (N = {end})")
            ax.axhspan(mean - hw, mean + hw, color=color, alpha=0.08, lw=0)
    for i, (kind, label) in enumerate(kinds.items()):
        stats = [data["by_n"][str(n)]["heldout_value"][kind] for n in data["sizes"]]
        means, hws = np.array([s["mean"] for s in stats]), np.array([s["ci95"] for s in stats])
        x = sizes * (1.0 + 0.04 * (i - (len(kinds) - 1) / 2))  # side by side on the log axis
        ax.errorbar(x, means, yerr=hws, color=colors[kind], marker="o", capsize=3, lw=1.4, label=label)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(sizes, [f"{n:d}" for n in data["sizes"]])
    ax.set_xlabel("user dialogues N (the untrained agent with the population)")
    ax.set_ylabel("held-out value (population, exact)")
    ax.set_title("Held-out value against user data: mean and 95% CI over seeds", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def table(data: dict[str, Any], kinds: dict[str, str] = KINDS) -> list[str]:
    """Per (N, arm): held-out value, its difference from fitted at the same N (paired), held-out NLL."""
    rows = []
    for n in data["sizes"]:
        row = data["by_n"][str(n)]
        for kind, label in kinds.items():
            name = label + (f" (weight {row['data_coef']:g})" if kind.endswith("_data") else "")
            delta = fmt(mean_ci(row["vs_fitted"][kind])) if kind in row["vs_fitted"] else "-"
            rows.append([str(n), name, fmt(mean_ci(row["heldout_value"][kind])), delta,
                         fmt(mean_ci(row["data_nll"][kind]))])
    return table_lines(["N", "arm", "held-out value", "Δ vs fitted (paired)", "held-out NLL of the data"],
                       rows)


def sentences(data: dict[str, Any]) -> list[str]:
    """Each computed from the curve: where fitted stands between the controls, and each arm against it."""
    lines = []
    controls = data["controls"]
    fitted = {n: data["by_n"][str(n)]["heldout_value"]["fitted"] for n in data["sizes"]}
    if len(controls) == 2:
        low, high = controls["frozen"]["mean"], controls["frozen_base"]["mean"]
        share = lambda v: (v - low) / (high - low)
        path = ", ".join(f"{fitted[n]['mean']:.3f} at N = {n} ({share(fitted[n]['mean']):.0%} of the gap)"
                         for n in data["sizes"])
        lines.append(f"The fitted simulator's held-out value is {path}, between the frozen collapsed "
                     f"simulator's {low:.3f} (N = 0) and the frozen base simulator's {high:.3f} (N = ∞).")
    for kind in ("cotrain_data", "vs_fitted"):
        deltas = {n: data["by_n"][str(n)]["vs_fitted"][kind] for n in data["sizes"]}
        verdicts = {n: direction(d) for n, d in deltas.items()}
        parts = ", ".join(f"{signed(d)} at N = {n} ({verdicts[n]})" for n, d in deltas.items())
        higher = [n for n, v in verdicts.items() if v == "higher"]
        summary = (f"above fitted at 95% at N = {', '.join(map(str, higher))}" if higher
                   else "above fitted at 95% at no N")
        lines.append(f"**{KINDS[kind]}** against fitted, paired by seed: {parts}; {summary}.")
    coefs = ", ".join(f"{data['by_n'][str(n)]['data_coef']:g} at N = {n}" for n in data["sizes"])
    lines.append(f"The data anchor's weight chosen by the rule: {coefs}.")
    return lines


def readme_lines(data: dict[str, Any]) -> list[str]:
    """The README's data curve: the curve's sentences (from data.json alone)."""
    return [f"The data curve (`:data`, docs/results/data.md, data anchor's weight: {data['rule']}):", "",
            *[f"- {x}" for x in sentences(data)]]


def markdown(data: dict[str, Any]) -> list[str]:
    return ["## The data curve", "", "![data curve](figures/data_curve.png)", "",
            f"Data anchor weight rule, stated before the run: {data['rule']}.", "",
            *[f"- {x}" for x in sentences(data)], "", *table(data), ""]


def _kind(arm: Arm) -> str | None:
    """An arm's kind on the data curve (None: not one of its arms, e.g. the scarce-data study's)."""
    if arm.mode == "cotrain" and arm.start == "collapsed" and arm.objective == "adversarial":
        return "cotrain_data"
    return arm.start if arm.start in ("fitted", "vs_fitted") and not arm.spec.trains_sims else None


def summarize(results: Results, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The curve of a run with data arms (None without)."""
    sizes = {arm.data for arm in results.settings.arms if arm.start == "vs_fitted"}
    points = {arm.name: {"kind": kind, "n": arm.data, "data_coef": arm.data_coef}
              for arm in results.settings.arms if arm.data in sizes and (kind := _kind(arm))}
    if not points:
        return None
    return curve(summary, points, results.settings.data.nll_tolerance)


SECTION = Section("data_curve", summarize, figure, markdown)
