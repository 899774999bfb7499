"""Figures, summary.md and summary.json of the collapse experiment, with 95% t-intervals over seeds.

"Final" numbers are the last exact evaluation (held-out value, success, donation, entropies, deviation,
variance share, gradient panel) and, for per-step curves (training reward, token entropy, zero-variance
groups), the mean over the last `eval_every` steps of each seed; "initial" ones the first evaluation
and the first `eval_every` steps. Every trained arm is compared with both controls, the frozen collapsed
simulator and the frozen base simulator, paired by seed (the arms share seeds, pretrained models and
rollout keys). Every sentence of summary.md about results is computed from `summarize`'s output (the
direction of a difference, and whether its interval excludes 0), so the README's numbers can be written
from summary.json alone (`readme_block`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from scope_jax.testbed.arms import CONTROLS, MODES, Arm  # noqa: E402
from scope_jax.testbed.experiment import ArmResult, Results  # noqa: E402
from scope_jax.testbed.gradients import GradientPanel  # noqa: E402
from scope_jax.training.run_dir import RunDir  # noqa: E402

COLORS = {"untrained": "0.5", "frozen": "tab:red", "frozen_base": "k", "verbalized": "tab:blue",
          "cotrain": "tab:green", "cotrain_base": "tab:olive", "cotrain_base_anchor": "tab:cyan",
          "population": "tab:purple", "population_base": "tab:pink", "rotation": "tab:orange",
          "mixture": "tab:brown", "selfplay": "gold"}
STEP_METRICS = {
    "reward": "training reward", "agent_entropy": "agent token entropy (train step, nats)",
    "zero_variance_groups": "zero-variance groups",
    "sampled_deviation": "simulator deviation (sampled turns)",
    "early_ask": "early donation requests", "vs_malformed": "malformed verbalizations",
    "vs_repaired": "repaired verbalizations",
}
EVAL_METRICS = {
    "heldout_value": "held-out value (population, exact)",
    "heldout_success": "held-out success P(donation >= $1)",
    "heldout_donation": "held-out donation ($)",
    "heldout_sims_value": "held-out transformer simulators: value",
    "train_value": "value on the training simulators (exact)",
    "sim_deviation": "simulator deviation (exact, on-policy)",
    "sim_kl_to_start": "simulator KL to its start (exact, on-policy)",
    "sim_variance_share": "simulator-side share of reward variance",
    "sim_side_variance": "simulator-side reward variance E[Var(r | h)] (Lemma 3.3)",
    "reward_variance": "reward variance on the training simulators",
    "entropy_on_sim": "entropy, on-simulator states",
    "entropy_off_sim": "entropy, off-simulator states", "first_turn_entropy": "first-turn entropy",
    "first_turn_inquiry": "first-turn P(personal inquiry)",
    "grad_cos_mode": "cos(g_train, g_mode)", "grad_cos_population": "cos(g_train, g_population)",
    "grad_dist_mode": "||g_train - g_mode||", "grad_norm": "||g_train||",
    "data_nll": "simulator NLL of the held-out user dialogues (nats per reply)",
}
DELTA_METRICS = ("heldout_value", "heldout_success", "heldout_donation", "heldout_sims_value",
                 "entropy_off_sim", "first_turn_entropy")
INITIAL_METRICS = ("heldout_value", "sim_deviation", "sim_side_variance", "reward_variance",
                   *GradientPanel.KEYS)
SWEEP_RULE = ("the setting whose co-trained simulator ends with the largest on-policy deviation "
              "(1 - p_max, exact) against the final agent, mean over seeds: the quantity Theorem 3.2's "
              "bound depends on, computed from the training simulator and the agent only (no held-out data)")


def interval(x: np.ndarray) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval) over the first axis; half-width NaN for one sample."""
    x = np.asarray(x, np.float64)
    n = len(x)
    if n < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n))


def fmt(mean_hw: tuple[float, float], digits: int = 3) -> str:
    mean, hw = mean_hw
    return f"{mean:.{digits}f}" if math.isnan(hw) else f"{mean:.{digits}f} ± {hw:.{digits}f}"


def _stat(values) -> dict[str, Any]:
    mean, hw = interval(values)
    return {"mean": mean, "ci95": hw, "seeds": np.asarray(values, np.float64).tolist()}


def _pair(stat: dict[str, Any]) -> tuple[float, float]:
    return stat["mean"], stat["ci95"]


def direction(stat: dict[str, Any], up: str = "higher", down: str = "lower") -> str:
    """`up` / `down` when the 95% interval excludes 0, else "not distinguishable from 0"."""
    mean, hw = _pair(stat)
    if math.isnan(hw):
        return f"{up if mean > 0 else down} (one seed, no interval)"
    return up if mean - hw > 0 else down if mean + hw < 0 else "not distinguishable from 0"


def signed(stat: dict[str, Any]) -> str:
    mean, hw = _pair(stat)
    return f"{mean:+.3f}" + ("" if math.isnan(hw) else f" ± {hw:.3f}")


def final_values(arm: ArmResult, tail: int) -> dict[str, np.ndarray]:
    """Per-seed final (and some initial) numbers [R] of one arm."""
    out = {k: v[:, -1] for k, v in arm.evals.items()}
    out |= {f"initial/{k}": arm.evals[k][:, 0] for k in INITIAL_METRICS}
    for k, v in arm.step_curves.items():
        out[f"step/{k}"] = v[:, -tail:].mean(1)
        out[f"initial/step/{k}"] = v[:, :tail].mean(1)
    return out


def selected_sweep_point(summary: dict[str, Any]) -> str | None:
    """The sweep arm the stated rule (SWEEP_RULE) chooses among the points of Co-Training's default
    objective (the setting it chooses is the default run's); None without such points."""
    points = [name for name, point in summary["sweep"].items() if point["objective"] == Arm.objective]
    if not points:
        return None
    return max(points, key=lambda name: summary["arms"][name]["sim_deviation"]["mean"])


def summarize(results: Results) -> dict[str, Any]:
    """Every final number, per seed and as mean / 95% half-width, paired deltas over both controls,
    the gradient panel's changes, and the sweep's points and choice."""
    tail = results.settings.rl.eval_every
    finals = {name: final_values(arm, tail) for name, arm in results.arms.items()}
    arms_by_name = {arm.name: arm for arm in results.settings.arms}
    deltas = {control: {name: {k: _stat(finals[name][k] - finals[control][k]) for k in DELTA_METRICS}
                        for name in finals if name not in (control, "untrained")}
              for control in CONTROLS if control in finals}
    if "untrained" in finals:
        untrained = finals["untrained"]["heldout_value"]
        deltas["untrained"] = {name: {"heldout_value": _stat(f["heldout_value"] - untrained)}
                               for name, f in finals.items() if name != "untrained"}
    panel_change = {name: {k: _stat(f[k] - f[f"initial/{k}"]) for k in GradientPanel.KEYS}
                    for name, f in finals.items() if name != "untrained"}
    sweep = {arm.name: {"kl": arm.sim_kl_coef, "lr": arm.sim_learning_rate, "objective": arm.objective}
             for arm in results.settings.arms if arm.sim_kl_coef is not None}
    summary = {
        "arms": {name: {k: _stat(v) for k, v in f.items()} for name, f in finals.items()},
        "deltas": deltas, "panel_change": panel_change, "sweep": sweep, "sweep_rule": SWEEP_RULE,
        "references": results.references, "pretraining": results.pretraining, "seconds": results.seconds,
        "labels": {name: arm.label for name, arm in results.arms.items()},
        "modes": {name: arms_by_name[name].mode for name in results.arms},
        "seeds": list(results.settings.seeds), "rl": vars(results.settings.rl) | {},
        "pretrain": vars(results.settings.pretrain) | {}, "vs_samples": results.settings.vs_samples,
    }
    summary["sweep_choice"] = selected_sweep_point(summary)
    return summary


# ----------------------------------------------------------------------------------------------------
# Figures


def _band(ax, x, curves, color, label, smooth: int = 1):
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        curves = np.array([np.convolve(np.pad(c, (smooth - 1, 0), mode="edge"), kernel, "valid")
                           for c in curves])
    mean = curves.mean(0)
    n = len(curves)
    hw = stats.t.ppf(0.975, n - 1) * curves.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros_like(mean)
    ax.plot(x, mean, color=color, label=label, lw=1.6)
    ax.fill_between(x, mean - hw, mean + hw, color=color, alpha=0.15, lw=0)


def _limits(ax, key: str) -> None:
    """Keep the axes to a metric's range: 95% bands over few seeds can be wider than it."""
    if key.startswith("grad_cos"):
        ax.set_ylim(-1.0, 1.0)
    elif any(word in key for word in ("entropy", "deviation", "variance", "grad", "sim_kl")):
        ax.set_ylim(bottom=0.0)
    else:
        ax.set_ylim(0.0, 2.0 if "donation" in key else 1.0)


def _curve(ax, arm_name: str, arm: ArmResult, key: str, steps: int, smooth: int):
    color = COLORS.get(arm_name, None)
    if key in arm.step_curves:
        _band(ax, np.arange(1, steps + 1), arm.step_curves[key], color, arm.label, smooth)
    elif key in arm.evals:
        values = arm.evals[key]
        if values.shape[1] == 1:  # untrained: constant
            ax.axhline(values.mean(), color=color, ls=":", lw=1.4, label=arm.label)
        else:
            _band(ax, arm.eval_steps, values, color, arm.label)


def _panels(results: Results, panels: tuple[tuple[str, str], ...], title: str, extra: Callable = None):
    steps = results.settings.rl.steps
    smooth = max(1, steps // 40)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 4))
    for ax, (key, panel_title) in zip(axes, panels):
        for name, arm in results.arms.items():
            if key in arm.step_curves or key in arm.evals:
                _curve(ax, name, arm, key, steps, smooth)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("RL step")
        _limits(ax, key)
    if extra:
        extra(axes)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"{title}: mean and 95% CI over {len(results.settings.seeds)} seeds "
                 f"(per-step curves smoothed over {smooth} steps)", fontsize=10)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return fig


def main_figure(results: Results):
    refs = results.references

    def references(axes):
        for name, style in (("best adaptive", "--"), ("best fixed sequence", "-."), ("persona known", ":")):
            axes[1].axhline(refs[name]["value"], color="k", ls=style, lw=0.9, label=f"{name} (exact)")

    return _panels(results, (("reward", "training reward (simulator)"),
                             ("heldout_value", "held-out value (population, exact)"),
                             ("agent_entropy", "agent token entropy (nats)")),
                   "Simulator collapse testbed", references)


def gradient_figure(results: Results):
    """Theorem 3.2 in the neural run: the training gradient against the mode user's and the population's."""
    return _panels(results, (("grad_cos_mode", "cos(g_train, g_mode)"),
                             ("grad_cos_population", "cos(g_train, g_population)"),
                             ("grad_dist_mode", "||g_train - g_mode||"),
                             ("sim_deviation", "on-policy simulator deviation")),
                   "Exact value gradients (Theorem 3.2)")


def metric_figure(results: Results, key: str, title: str):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, arm in results.arms.items():
        _curve(ax, name, arm, key, results.settings.rl.steps, 1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    _limits(ax, key)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------
# Sentences and tables, from the summary only


def _label(summary, name):
    return summary["labels"][name]


def collapse_sentence(summary: dict[str, Any]) -> str | None:
    arms, deltas = summary["arms"], summary["deltas"]
    if "frozen" not in arms:
        return None
    f = arms["frozen"]
    s = (f"Against the frozen collapsed simulator the training reward went from "
         f"{f['initial/step/reward']['mean']:.3f} (first {summary['rl']['eval_every']} steps) to "
         f"{f['step/reward']['mean']:.3f} (last {summary['rl']['eval_every']}), and held-out value ended at "
         f"{fmt(_pair(f['heldout_value']))}")
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
        parts = [f"{signed(d)} vs the {_label(summary, c)} ({direction(d)})" for c, d in against.items()]
        if parts:
            lines.append(f"**{_label(summary, name)}**: held-out value {'; '.join(parts)}.")
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
    return (f"Gradient panel, {_label(summary, name)}: cos(g_train, g_mode) went from "
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
    return (f"The best arm, {_label(summary, best)}, ends at {arms[best]['heldout_value']['mean']:.3f} "
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
    s = (f"Sweep: the rule chooses {_label(summary, choice)} (final simulator deviation "
         f"{fmt(_pair(arm['sim_deviation']))}); its held-out value is {fmt(_pair(arm['heldout_value']))}")
    return s + (f", {signed(d['heldout_value'])} vs the frozen collapsed simulator "
                f"({direction(d['heldout_value'])})." if d else ".")


def findings(summary: dict[str, Any]) -> list[str]:
    lines = [collapse_sentence(summary)] + comparison_sentences(summary)
    lines += [panel_sentence(summary, name) for name in ("frozen", "cotrain")]
    lines += [sweep_sentence(summary), ceiling_sentence(summary)]
    return [line for line in lines if line]


ARM_COLUMNS = (  # (label, key in the arm's finals, formatter)
    ("train reward", "step/reward", lambda s: fmt(_pair(s))),
    ("held-out value", "heldout_value", lambda s: fmt(_pair(s))),
    ("held-out success", "heldout_success", lambda s: fmt(_pair(s))),
    ("donation $", "heldout_donation", lambda s: f"${s['mean']:.3f}"),
    ("held-out sims value", "heldout_sims_value", lambda s: fmt(_pair(s))),
    ("token entropy", "step/agent_entropy", lambda s: f"{s['mean']:.2f}"),
    ("off-sim entropy", "entropy_off_sim", lambda s: f"{s['mean']:.2f}"),
    ("sim deviation", "sim_deviation", lambda s: fmt(_pair(s))),
    ("sim KL to start", "sim_kl_to_start", lambda s: f"{s['mean']:.3f}"),
    ("sim-side variance", "sim_side_variance", lambda s: f"{s['mean']:.4f}"),
    ("zero-var groups", "step/zero_variance_groups", lambda s: f"{s['mean']:.2f}"),
)
DELTA_COLUMNS = (("Δ held-out value", "heldout_value"), ("Δ success", "heldout_success"),
                 ("Δ held-out sims value", "heldout_sims_value"), ("Δ off-sim entropy", "entropy_off_sim"))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    row = lambda cells: "| " + " | ".join(cells) + " |"
    return [row(header), "|" + "---|" * len(header)] + [row(r) for r in rows]


def arms_table(summary: dict[str, Any], columns=ARM_COLUMNS, names=None) -> list[str]:
    """Rows of (arm, column cells); a cell an arm has no number for is "-" (untrained: train value)."""
    rows = []
    for name in names or summary["arms"]:
        arm = summary["arms"][name]
        key_of = lambda k: k if k in arm else {"step/reward": "train_value"}.get(k, k)
        rows.append([_label(summary, name)] + [fmt_(arm[key_of(k)]) if key_of(k) in arm else "-"
                                               for _, k, fmt_ in columns])
    return _table(["arm"] + [c for c, _, _ in columns], rows)


def deltas_table(summary: dict[str, Any], control: str) -> list[str]:
    rows = [[_label(summary, name)] + [fmt(_pair(d[k])) for _, k in DELTA_COLUMNS]
            for name, d in summary["deltas"].get(control, {}).items()]
    return _table(["arm"] + [c for c, _ in DELTA_COLUMNS], rows)


def sweep_table(summary: dict[str, Any]) -> list[str]:
    """Every sweep point: its setting, held-out value (and against frozen), how far the simulator moved."""
    rows = []
    for name, point in summary["sweep"].items():
        arm, d = summary["arms"][name], summary["deltas"].get("frozen", {}).get(name)
        rows.append([f"{point['kl']:g}", f"{point['lr']:g}", point["objective"],
                     fmt(_pair(arm["heldout_value"])), fmt(_pair(d["heldout_value"])) if d else "-",
                     fmt(_pair(arm["step/reward"])),
                     fmt(_pair(arm["sim_deviation"])), fmt(_pair(arm["sim_kl_to_start"])),
                     "chosen" if name == summary["sweep_choice"] else ""])
    return _table(["KL", "sim lr", "objective", "held-out value", "Δ vs frozen", "train reward",
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


class Section(NamedTuple):
    """An optional part of the report (e.g. `testbed.data_report.SECTION`): its summary.json entry under
    `key` (summarize returns None when the run has nothing for it), its figure `figures/KEY.png` and its
    summary.md lines."""

    key: str
    summarize: Callable[[Results, dict[str, Any]], dict[str, Any] | None]
    figure: Callable[[dict[str, Any], dict[str, str]], Any]
    markdown: Callable[[dict[str, Any]], list[str]]


def markdown(results: Results, summary: dict[str, Any], sections: Sequence[Section] = ()) -> str:
    s, rl, pt = results.settings, results.settings.rl, results.settings.pretrain
    pre = summary["pretraining"]
    mean_sd = lambda xs: f"{np.mean(xs):.3f} (seeds {', '.join(f'{x:.3f}' for x in np.ravel(xs))})"
    lines = [
        "# Simulator collapse testbed", "",
        f"Seeds {list(s.seeds)}; agent and simulators are {pt.num_layers}-layer, d={pt.hidden_size} decoders "
        f"(the project's decoder); RL: {rl.steps} steps of {rl.episodes} episodes in groups of "
        f"{rl.group_size}, GRPO, agent lr {rl.learning_rate:g}, simulator lr {rl.sim_learning_rate:g}, "
        f"simulator KL {rl.sim_kl_coef:g}, adversarial simulator objective unless named; rotation takes "
        f"the simulators in turn every {rl.rotation_block} step(s). Held-out users: the exact population "
        f"(all values below are exact sums over trajectories) and {len(pre['heldout'])} independently "
        f"trained transformer simulators. Success = the persuadee gives at least $1 (score ≥ 1); donation = "
        f"2 x reward. "
        f"Mean ± 95% t-interval over seeds. Wall time of this process {results.seconds['total']:.0f} s "
        f"(pretraining and arms loaded from the run directory are not redone; the table at the end gives "
        f"each arm's own time).", "",
        "![main](figures/main.png)", "", "![gradient panel](figures/gradient_panel.png)", "",
        construction_paragraph(summary), "",
        "## What appeared", "", *[f"- {x}" for x in findings(summary)], "",
        "## Final numbers per arm", "", *arms_table(summary), "",
        "Train reward: mean over the last evaluation interval of steps (untrained: its exact value on the "
        "collapsed simulator). Held-out and simulator columns: the last exact evaluation. Token entropy: the "
        "train step's mean entropy of the agent's act distribution at its sampled decisions; off-sim "
        "entropy: exact, over the states the population reaches more often than the training simulators. "
        f"Verbalized Sampling's simulator columns are taken on what it answers in training ({s.vs_samples} "
        "sampled verbalizations per context, fallbacks included).", "",
    ]
    for control in CONTROLS:
        if control in summary["deltas"]:
            lines += [f"## Against the {_label(summary, control)} (paired by seed)", "",
                      *deltas_table(summary, control), ""]
    panel_columns = tuple((EVAL_METRICS[k], k, lambda s: fmt(_pair(s))) for k in GradientPanel.KEYS) + (
        ("sim deviation", "sim_deviation", lambda s: fmt(_pair(s))),)
    lines += ["## Gradient panel at the end (Theorem 3.2)", "",
              *arms_table(summary, panel_columns, [a for a in summary["arms"] if a != "untrained"]), ""]
    if summary["sweep"]:
        lines += ["## Co-Training sweep (from the collapsed simulator, anchored to its start)", "",
                  f"Rule, stated before the sweep was run: choose {SWEEP_RULE}.", "",
                  *sweep_table(summary), ""]
    for section in sections:
        if section.key in summary:
            lines += section.markdown(summary[section.key])
    lines += ["## Exact values on the population", "", *_table(
        ["policy", "value", "donation", "success"],
        [[name, f"{r['value']:.4f}", f"${r['donation']:.3f}", f"{r['success']:.4f}"]
         for name, r in summary["references"].items()]), ""]
    rows = [[label, mean_sd(reduce(pre[key]))] for label, key, reduce in PRETRAINING_ROWS if key in pre]
    rows += [[f"held-out simulator {h} (prior {np.round(x['prior'], 2).tolist()}): TV to its population, "
              f"deviation", f"{x['tv_to_own_population']:.3f}, {x['deviation']:.3f}"]
             for h, x in enumerate(pre["heldout"])]
    lines += ["## Simulators after pretraining (on-policy with the pretrained agent, exact)", "",
              *_table(["quantity", "value"], rows), ""]
    missing = [m for m in MODES if m not in summary["modes"].values()]
    if missing:
        lines += [f"Modes not run in this configuration: {', '.join(missing)}.", ""]
    seconds = [[k, f"{v:.1f}"] for k, v in results.seconds.items()]
    lines += ["## Wall time (s)", "", *_table(["phase", "seconds"], seconds), "",
              "Per-metric figures: `figures/metric_*.png`; every curve point per seed: `metrics.jsonl`."]
    return "\n".join(lines)


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


def write(results: Results, run_dir: RunDir, sections: Sequence[Section] = ()) -> dict[str, Any]:
    """All figures, summary.json and summary.md (written last: it marks the run finished)."""
    run_dir.save_figure(main_figure(results), "main")
    run_dir.save_figure(gradient_figure(results), "gradient_panel")
    for key, title in {**STEP_METRICS, **EVAL_METRICS}.items():
        if any(key in a.step_curves or key in a.evals for a in results.arms.values()):
            run_dir.save_figure(metric_figure(results, key, title), f"metric_{key}")
    summary = summarize(results)
    for section in sections:
        if (part := section.summarize(results, summary)) is not None:
            summary[section.key] = part
            run_dir.save_figure(section.figure(part, summary["labels"]), section.key)
    run_dir.write_json("summary.json", summary)
    run_dir.write_summary(markdown(results, summary, sections))
    return summary
