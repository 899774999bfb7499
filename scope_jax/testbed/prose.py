"""summary.md's sentences and tables, and the README's testbed block, from the summary alone.

Every sentence about results is computed from `statistics.summarize`'s output (the direction of a
difference, and whether its interval excludes 0), so the README's numbers can be written from
summary.json alone (`readme_block`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scope_jax.testbed.arms import CONTROLS
from scope_jax.testbed.statistics import direction, mean_ci


def fmt(mean_hw: tuple[float, float], digits: int = 3) -> str:
    mean, hw = mean_hw
    return f"{mean:.{digits}f}" if math.isnan(hw) else f"{mean:.{digits}f} ± {hw:.{digits}f}"


def signed(stat: dict[str, Any]) -> str:
    mean, hw = mean_ci(stat)
    return f"{mean:+.3f}" + ("" if math.isnan(hw) else f" ± {hw:.3f}")


def arm_label(summary, name):
    """The arm's name as the report prints it."""
    return summary["labels"][name]


def collapse_sentence(summary: dict[str, Any]) -> str | None:
    arms, deltas = summary["arms"], summary["deltas"]
    if "frozen" not in arms:
        return None
    f = arms["frozen"]
    s = (f"Against the frozen collapsed simulator the training reward went from "
         f"{f['initial/step/reward']['mean']:.3f} (first {summary['rl']['eval_every']} steps) to "
         f"{f['step/reward']['mean']:.3f} (last {summary['rl']['eval_every']}), and held-out value ended at "
         f"{fmt(mean_ci(f['heldout_value']))}")
    if "untrained" in deltas:
        d = deltas["untrained"]["frozen"]["heldout_value"]
        below = sum(x < 0 for x in d["seeds"])
        s += (f", {signed(d)} from the untrained agent's {arms['untrained']['heldout_value']['mean']:.3f} "
              f"(paired; {direction(d)}; below it in {below} of {len(d['seeds'])} seeds)")
    return s + "."


def comparison_sentences(summary: dict[str, Any]) -> list[str]:
    """One sentence per trained arm: its held-out value against each control, paired by seed."""
    lines = []
    deltas = summary["deltas"]
    for name in summary["arms"]:
        if name in ("untrained", "frozen"):
            continue
        against = {c: deltas[c][name]["heldout_value"] for c in CONTROLS if c in deltas and name in deltas[c]}
        parts = [f"{signed(d)} vs the {arm_label(summary, c)} ({direction(d)})" for c, d in against.items()]
        if parts:
            lines.append(f"**{arm_label(summary, name)}**: held-out value {'; '.join(parts)}.")
    return lines


def panel_sentence(summary: dict[str, Any], name: str = "frozen") -> str | None:
    """Theorem 3.2's prediction for an arm, checked on the paired change from step 0 to the end."""
    if name not in summary["panel_change"]:
        return None
    arm, change = summary["arms"][name], summary["panel_change"][name]
    mode, pop = change["grad_cos_mode"], change["grad_cos_population"]
    held = (direction(mode, "rose", "fell") == "rose") and (direction(pop, "rose", "fell") == "fell")
    path = lambda key, n=3: f"{arm['initial/' + key]['mean']:.{n}f} to {arm[key]['mean']:.{n}f}"
    ratio = lambda at: f"{arm[at + 'grad_dist_mode']['mean'] / arm[at + 'sim_deviation']['mean']:.2f}"
    return (f"Gradient panel, {arm_label(summary, name)}: cos(g_train, g_mode) went from "
            f"{path('grad_cos_mode')} "
            f"(change {signed(mode)}, {direction(mode, 'rose', 'fell')}), cos(g_train, g_population) from "
            f"{path('grad_cos_population')} (change {signed(pop)}, {direction(pop, 'rose', 'fell')}), "
            f"||g_train - g_mode|| from {path('grad_dist_mode', 4)} "
            f"(||g_train|| from {path('grad_norm', 4)}) "
            f"at on-policy deviation from {path('sim_deviation')} (distance over deviation "
            f"{ratio('initial/')} at the start, {ratio('')} at the end). The prediction (the first rises "
            f"while the "
            f"second falls, both at 95%) {'holds' if held else 'does not hold'} here.")


def ceiling_sentence(summary: dict[str, Any]) -> str:
    arms, pre = summary["arms"], summary["pretraining"]
    best = max(arms, key=lambda a: arms[a]["heldout_value"]["mean"])
    return (f"The best arm, {arm_label(summary, best)}, ends at {arms[best]['heldout_value']['mean']:.3f} "
            f"held-out value; the adaptive ceiling is {summary['references']['best adaptive']['value']:.3f} "
            f"and the "
            f"population value of the best response to the base transformer simulator "
            f"{np.mean(pre['base_best_response_value']):.3f}, to the Verbalized Sampling simulator "
            f"{np.mean(pre['verbalized_best_response_value']):.3f}.")


def sweep_sentence(summary: dict[str, Any]) -> str | None:
    choice = summary["sweep_choice"]
    if choice is None:
        return None
    arm, d = summary["arms"][choice], summary["deltas"].get("frozen", {}).get(choice)
    s = (f"Sweep: the rule chooses {arm_label(summary, choice)} (final simulator deviation "
         f"{fmt(mean_ci(arm['sim_deviation']))}); its held-out value is {fmt(mean_ci(arm['heldout_value']))}")
    return s + (f", {signed(d['heldout_value'])} vs the frozen collapsed simulator "
                f"({direction(d['heldout_value'])})." if d else ".")


def findings(summary: dict[str, Any]) -> list[str]:
    lines = [collapse_sentence(summary)] + comparison_sentences(summary)
    lines += [panel_sentence(summary, name) for name in ("frozen", "cotrain")]
    lines += [sweep_sentence(summary), ceiling_sentence(summary)]
    return [line for line in lines if line]


ARM_COLUMNS = (  # (label, key in the arm's finals, formatter)
    ("train reward", "step/reward", lambda s: fmt(mean_ci(s))),
    ("held-out value", "heldout_value", lambda s: fmt(mean_ci(s))),
    ("held-out success", "heldout_success", lambda s: fmt(mean_ci(s))),
    ("donation $", "heldout_donation", lambda s: f"${s['mean']:.3f}"),
    ("held-out sims value", "heldout_sims_value", lambda s: fmt(mean_ci(s))),
    ("token entropy", "step/agent_entropy", lambda s: f"{s['mean']:.2f}"),
    ("off-sim entropy", "entropy_off_sim", lambda s: f"{s['mean']:.2f}"),
    ("sim deviation", "sim_deviation", lambda s: fmt(mean_ci(s))),
    ("sim KL to start", "sim_kl_to_start", lambda s: f"{s['mean']:.3f}"),
    ("sim-side variance", "sim_side_variance", lambda s: f"{s['mean']:.4f}"),
    ("zero-var groups", "step/zero_variance_groups", lambda s: f"{s['mean']:.2f}"),
)
DELTA_COLUMNS = (("Δ held-out value", "heldout_value"), ("Δ success", "heldout_success"),
                 ("Δ held-out sims value", "heldout_sims_value"), ("Δ off-sim entropy", "entropy_off_sim"))


def table_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    row = lambda cells: "| " + " | ".join(cells) + " |"
    return [row(header), "|" + "---|" * len(header)] + [row(r) for r in rows]


def arms_table(summary: dict[str, Any], columns=ARM_COLUMNS, names=None) -> list[str]:
    """Rows of (arm, column cells); a cell an arm has no number for is "-" (untrained: train value)."""
    rows = []
    for name in names or summary["arms"]:
        arm = summary["arms"][name]
        key_of = lambda k: k if k in arm else {"step/reward": "train_value"}.get(k, k)
        rows.append([arm_label(summary, name)] + [fmt_(arm[key_of(k)]) if key_of(k) in arm else "-"
                                               for _, k, fmt_ in columns])
    return table_lines(["arm"] + [c for c, _, _ in columns], rows)


def deltas_table(summary: dict[str, Any], control: str) -> list[str]:
    rows = [[arm_label(summary, name)] + [fmt(mean_ci(d[k])) for _, k in DELTA_COLUMNS]
            for name, d in summary["deltas"].get(control, {}).items()]
    return table_lines(["arm"] + [c for c, _ in DELTA_COLUMNS], rows)


def sweep_table(summary: dict[str, Any]) -> list[str]:
    """Every sweep point: its setting, held-out value (and against frozen), how far the simulator moved."""
    rows = []
    for name, point in summary["sweep"].items():
        arm, d = summary["arms"][name], summary["deltas"].get("frozen", {}).get(name)
        rows.append([f"{point['kl']:g}", f"{point['lr']:g}", point["objective"],
                     fmt(mean_ci(arm["heldout_value"])), fmt(mean_ci(d["heldout_value"])) if d else "-",
                     fmt(mean_ci(arm["step/reward"])),
                     fmt(mean_ci(arm["sim_deviation"])), fmt(mean_ci(arm["sim_kl_to_start"])),
                     "chosen" if name == summary["sweep_choice"] else ""])
    return table_lines(["KL", "sim lr", "objective", "held-out value", "Δ vs frozen", "train reward",
                   "sim deviation (rule)", "sim KL to start", ""], rows)


def construction_paragraph(summary: dict[str, Any]) -> str:
    """What the game was calibrated to produce and what each arm is given (no results)."""
    pre = summary["pretraining"]
    return (
        "**What holds by construction.** The personas' tilts (`envs/personas.py`) were fitted so that the "
        "tabular game reproduces the checked recipe: the collapsed persona (emotional, made agreeable) is a "
        "minority whose favourite acts (emotion appeals, personal stories) the skeptic dislikes, so the best "
        "response to the tabular collapsed simulator is worth less on the population than the untrained "
        f"agent ({summary['references']['best response to the collapsed simulator']['value']:.3f} against "
        f"{summary['references']['untrained (P4G frequencies)']['value']:.3f}); inquiring first is the best "
        "adaptive opening. What each arm is given: the frozen base simulator is the pre-alignment model "
        "trained on the population, so its arm measures what a faithful simulator alone is worth. Verbalized "
        "Sampling is the collapsed model taught to state the base model's own reply distribution (TV "
        f"{np.mean(pre['verbalized_tv_to_base']):.3f} on-policy between what it states, sampled as in "
        "training, and the base model's replies), so it can be worth about what the frozen base simulator "
        "is, not more. Co-Training starts from the collapsed simulator and is anchored to it: it never sees "
        "the "
        "base model or the population, only the agent's reward; the two base variants do see the base "
        "model. Population Co-Training, rotation and mixture use four collapsed models, one per persona "
        "direction, made with the base model's persona cards: they are given the persona structure. "
        "Self-play's joint model learnt both roles on the same data and was collapsed by the same step.")


same = np.asarray
PRETRAINING_ROWS = (  # (label, key in the pretraining diagnostics, reduction per seed)
    ("deviation 1 - p_max: population (truth)", "population_deviation", same),
    ("deviation: base simulator, direct", "base_deviation", same),
    ("deviation: collapsed simulator, direct", "collapsed_deviation", same),
    ("deviation: collapsed simulator, verbalized (sampled)", "verbalized_deviation", same),
    ("deviation: tabular collapsed simulator (reference)", "tabular_collapsed_deviation", same),
    ("TV base (no card) vs population", "base_tv", same),
    ("TV base with persona card vs persona (mean of 4)", "card_tv", lambda x: np.mean(x, 1)),
    ("TV verbalized vs population", "verbalized_tv", same),
    ("TV verbalized vs the base model's replies", "verbalized_tv_to_base", same),
    ("TV collapsed vs tabular collapsed simulator", "collapsed_tv_to_tabular", same),
    ("malformed verbalizations (on-policy)", "verbalized_malformed", same),
    ("population value of the best response to the base simulator", "base_best_response_value", same),
    ("population value of the best response to the verbalized simulator", "verbalized_best_response_value",
     same),
    ("pretrained agent: first-turn TV to P4G frequencies", "agent_first_turn_tv_to_p4g", same),
    ("self-play joint model: agent role's population value", "selfplay_agent_value", same),
    ("self-play joint model: user role's deviation", "selfplay_deviation", same),
)


README_COLUMNS = ARM_COLUMNS[:3] + (("token entropy", "step/agent_entropy", lambda s: f"{s['mean']:.2f}"),)


def readme_block(summary: dict[str, Any]) -> str:
    """The README's testbed numbers, from summary.json alone."""
    rl = summary["rl"]
    lines = [f"{len(summary['seeds'])} seeds, {rl['steps']} RL steps of {rl['groups'] * rl['group_size']} "
             f"episodes (GRPO, groups of {rl['group_size']}), mean ± 95% t-interval; every held-out number "
             f"is exact. Time against the 10-minute budget: docs/results/README.md.", "",
             *arms_table(summary, README_COLUMNS), "",
             *[f"- {x}" for x in findings(summary)]]
    return "\n".join(lines)


def objective_verdicts(by_objective: dict[str, list[dict[str, Any]]]) -> str:
    """Per objective, its settings' paired differences from the frozen collapsed simulator: their range,
    and at how many the 95% interval lies above or below 0."""
    parts = []
    for objective, points in by_objective.items():
        means = [d["mean"] for d in points]
        verdicts = [direction(d) for d in points]
        parts.append(f"{objective}: {len(points)} settings, held-out value {min(means):+.3f} to "
                     f"{max(means):+.3f} against the frozen collapsed simulator (paired by seed), above it at "
                     f"95% at {verdicts.count('higher')}, below at {verdicts.count('lower')}")
    return "; ".join(parts)


def sweep_null_sentence(sweep: dict[str, Any]) -> str | None:
    """The sweep's verdict on the simulator objectives that do not see the users, per objective: every
    point against the frozen collapsed simulator, paired by seed (from sweep.json alone)."""
    deltas = sweep["deltas"].get("frozen", {})
    by_objective: dict[str, list[dict[str, Any]]] = {}
    for name, point in sweep["sweep"].items():
        by_objective.setdefault(point["objective"], []).append(deltas[name]["heldout_value"])
    if not by_objective:
        return None
    base = sweep["arms"]["frozen_base"]["heldout_value"]["mean"] - sweep["arms"]["frozen"]["heldout_value"]["mean"]
    return (f"Simulator objectives that do not see the users, neural evidence (`:sweep`, Co-Training like "
            f"for like over KL weight x simulator learning rate, {len(sweep['seeds'])} seeds): "
            f"{objective_verdicts(by_objective)}; the frozen base simulator is {base:+.3f} above the frozen "
            "collapsed one.")
