"""Figures, summary.md and summary.json of the collapse experiment, with 95% t-intervals over seeds.

"Final" numbers are the last exact evaluation (held-out value, success, donation, entropies, deviation,
variance share) and, for per-step curves (training reward, token entropy, zero-variance groups), the
mean over the last `eval_every` steps of each seed. Deltas of each fix over the single frozen
simulator are paired by seed (the arms share seeds, pretrained models and rollout keys).
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from scope_jax.testbed import arms as arms_lib  # noqa: E402
from scope_jax.testbed.arms import FIXES  # noqa: E402
from scope_jax.testbed.experiment import ArmResult, Results  # noqa: E402
from scope_jax.training.run_dir import RunDir  # noqa: E402

COLORS = {"untrained": "0.5", "frozen": "tab:red", "verbalized": "tab:blue", "cotrain": "tab:green",
          "population": "tab:purple", "rotation": "tab:orange", "cotrain_collapsed": "tab:olive"}
STEP_METRICS = {
    "reward": "training reward", "agent_entropy": "agent token entropy (train step, nats)",
    "zero_variance_groups": "zero-variance groups",
    "sampled_deviation": "simulator deviation (sampled turns)",
    "early_ask": "early donation requests", "vs_malformed": "malformed verbalizations",
    "vs_repaired": "repaired verbalizations", "sim_kl": "simulator KL to reference",
}
EVAL_METRICS = {
    "heldout_value": "held-out value (population, exact)",
    "heldout_success": "held-out success P(donation >= $1)",
    "heldout_donation": "held-out donation ($)",
    "heldout_sims_value": "held-out transformer simulators: value",
    "train_value": "value on the training simulators (exact)",
    "sim_deviation": "simulator deviation (exact, on-policy)",
    "sim_variance_share": "simulator-side share of reward variance",
    "sim_side_variance": "simulator-side reward variance E[Var(r | h)] (Lemma 3.3)",
    "reward_variance": "reward variance on the training simulators",
    "entropy_on_sim": "entropy, on-simulator states",
    "entropy_off_sim": "entropy, off-simulator states", "first_turn_entropy": "first-turn entropy",
    "first_turn_inquiry": "first-turn P(personal inquiry)",
}


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


def final_values(arm: ArmResult, tail: int) -> dict[str, np.ndarray]:
    """Per-seed final numbers [R] of one arm."""
    out = {k: v[:, -1] for k, v in arm.evals.items()}
    for k, v in arm.step_curves.items():
        out[f"step/{k}"] = v[:, -tail:].mean(1)
    return out


def _band(ax, x, curves, color, label, smooth: int = 1):
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        curves = np.array([np.convolve(np.pad(c, (smooth - 1, 0), mode="edge"), kernel, "valid")
                           for c in curves])
    mean = curves.mean(0)
    n = len(curves)
    hw = stats.t.ppf(0.975, n - 1) * curves.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros_like(mean)
    ax.plot(x, mean, color=color, label=label, lw=1.6)
    ax.fill_between(x, mean - hw, mean + hw, color=color, alpha=0.18, lw=0)


def _limits(ax, key: str) -> None:
    """Keep the axes to a metric's range: 95% bands over 3 seeds can be wider than it."""
    if "entropy" in key or "deviation" in key or key.endswith("variance") or key == "sim_kl":
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


def main_figure(results: Results):
    steps = results.settings.rl.steps
    smooth = max(1, steps // 40)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("reward", "training reward (simulator)"),
              ("heldout_success", "held-out success: P(donation ≥ $1)"),
              ("agent_entropy", "agent token entropy (nats)"))
    for ax, (key, title) in zip(axes, panels):
        for name, arm in results.arms.items():
            if key in arm.step_curves or key in arm.evals:
                _curve(ax, name, arm, key, steps, smooth)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        _limits(ax, key)
    refs = results.references
    for name, style in (("best adaptive", "--"), ("best fixed sequence", "-."), ("persona known", ":")):
        axes[1].axhline(refs[name]["success"], color="k", ls=style, lw=0.9, label=f"{name} (exact)")
    if "untrained" in results.arms:
        axes[0].axhline(results.arms["untrained"].evals["train_value"].mean(), color="0.5", ls=":", lw=1.4)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"Simulator collapse testbed: mean and 95% CI over {len(results.settings.seeds)} seeds "
                 f"(per-step curves smoothed over {smooth} steps)", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def metric_figure(results: Results, key: str, title: str):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, arm in results.arms.items():
        _curve(ax, name, arm, key, results.settings.rl.steps, 1)
    if key in ("heldout_value", "heldout_success", "heldout_donation"):
        field = {"heldout_value": "value", "heldout_success": "success", "heldout_donation": "donation"}[key]
        for name, style in (("best adaptive", "--"), ("best fixed sequence", "-.")):
            ax.axhline(results.references[name][field], color="k", ls=style, lw=0.9, label=f"{name} (exact)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    _limits(ax, key)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def summarize(results: Results) -> dict[str, Any]:
    """Every final number, per seed and as mean / 95% half-width, plus paired deltas over frozen."""
    tail = results.settings.rl.eval_every
    finals = {name: final_values(arm, tail) for name, arm in results.arms.items()}
    table = {name: {k: {"mean": interval(v)[0], "ci95": interval(v)[1], "seeds": v.tolist()}
                    for k, v in f.items()} for name, f in finals.items()}
    deltas = {}
    if "frozen" in finals:
        for fix in FIXES:
            if fix in finals:
                deltas[fix] = {}
                for k in ("heldout_value", "heldout_success", "heldout_donation", "heldout_sims_value",
                          "entropy_off_sim", "first_turn_entropy"):
                    d = finals[fix][k] - finals["frozen"][k]
                    deltas[fix][k] = {"mean": interval(d)[0], "ci95": interval(d)[1], "seeds": d.tolist()}
    return {"arms": table, "deltas_over_frozen": deltas, "references": results.references,
            "pretraining": results.pretraining, "seconds": results.seconds,
            "labels": {name: arm.label for name, arm in results.arms.items()},
            "seeds": list(results.settings.seeds), "rl": vars(results.settings.rl) | {},
            "pretrain": vars(results.settings.pretrain) | {}}


def _findings(results: Results, summary: dict[str, Any]) -> list[str]:
    """Plain statements of what the numbers show, with the interval each rests on."""
    arms, deltas, lines = summary["arms"], summary["deltas_over_frozen"], []
    get = lambda arm, k: (arms[arm][k]["mean"], arms[arm][k]["ci95"])
    untrained = arms.get("untrained", {}).get("heldout_value", {}).get("mean")
    if "frozen" in arms:
        f = results.arms["frozen"]
        start_r, end_r = f.step_curves["reward"][:, :10].mean(), get("frozen", "step/reward")[0]
        value, hw = get("frozen", "heldout_value")
        ent0, ent1 = f.step_curves["agent_entropy"][:, :10].mean(), get("frozen", "step/agent_entropy")[0]
        s = (f"**Single frozen simulator.** Training reward went from {start_r:.3f} (first 10 steps) to "
             f"{end_r:.3f}; agent token entropy from {ent0:.2f} to {ent1:.2f} nats; held-out value "
             f"{fmt((value, hw))}")
        if untrained is not None:
            below = (value + (0 if math.isnan(hw) else hw)) < untrained
            above = (value - (0 if math.isnan(hw) else hw)) > untrained
            s += (f", {'below' if below else 'above' if above else 'not distinguishable from'} the untrained "
                  f"agent's {untrained:.3f}")
            per_seed = np.array(arms["frozen"]["heldout_value"]["seeds"]) < untrained
            s += f" ({int(per_seed.sum())} of {len(per_seed)} seeds below it)."
        var0, var1 = f.evals["sim_side_variance"][:, 0].mean(), get("frozen", "sim_side_variance")[0]
        s += (f" Exact on-policy entropy on the states its simulator produces fell to "
              f"{get('frozen', 'entropy_on_sim')[0]:.2f} nats; the simulator-side reward variance "
              f"(Lemma 3.3) from {var0:.4f} to {var1:.4f}, with "
              f"{get('frozen', 'step/zero_variance_groups')[0]:.0%} of groups at zero variance at the end "
              f"(the simulator-side *share* rises because the agent-side part vanishes faster).")
        lines.append(s)
    for fix, d in deltas.items():
        dv, hv = d["heldout_value"]["mean"], d["heldout_value"]["ci95"]
        ds, hs = d["heldout_success"]["mean"], d["heldout_success"]["ci95"]
        sign = ("higher" if dv - hv > 0 else "lower" if dv + hv < 0 else "not distinguishable") \
            if not math.isnan(hv) else ("higher" if dv > 0 else "lower")
        ent = get(fix, "step/agent_entropy")[0]
        lines.append(f"**{results.arms[fix].label}** vs single frozen simulator: held-out value "
                     f"{dv:+.3f} ± {hv:.3f}, success {ds:+.3f} ± {hs:.3f} ({sign} at 95%); "
                     f"final token entropy {ent:.2f} nats vs {get('frozen', 'step/agent_entropy')[0]:.2f}; "
                     f"simulator-side variance {get(fix, 'sim_side_variance')[0]:.4f}.")
    return lines


def write(results: Results, run_dir: RunDir) -> dict[str, Any]:
    """All figures, summary.json and summary.md (written last: it marks the run finished)."""
    run_dir.save_figure(main_figure(results), "main")
    for key, title in {**STEP_METRICS, **EVAL_METRICS}.items():
        if any(key in a.step_curves or key in a.evals for a in results.arms.values()):
            run_dir.save_figure(metric_figure(results, key, title), f"metric_{key.replace('/', '_')}")
    summary = summarize(results)
    run_dir.write_json("summary.json", summary)
    run_dir.write_summary(markdown(results, summary))
    return summary


def markdown(results: Results, summary: dict[str, Any]) -> str:
    s, rl, pt = results.settings, results.settings.rl, results.settings.pretrain
    arms, pre = summary["arms"], summary["pretraining"]
    mean_sd = lambda xs: f"{np.mean(xs):.3f} (seeds {', '.join(f'{x:.3f}' for x in np.ravel(xs))})"
    lines = [
        "# Simulator collapse testbed", "",
        f"Seeds {list(s.seeds)}; agent and simulators are {pt.num_layers}-layer, d={pt.hidden_size} decoders "
        f"(the project's decoder); RL: {rl.steps} steps of {rl.episodes} episodes in groups of "
        f"{rl.group_size}, GRPO, agent lr {rl.learning_rate:g}, simulator lr {rl.sim_learning_rate:g}, "
        f"simulator KL {rl.sim_kl_coef:g}. Held-out users: the exact population (all values below are exact "
        f"sums over trajectories) and {len(pre['heldout'])} independently trained transformer simulators. "
        f"Success = the persuadee gives at least $1 (score ≥ 1); donation = 2 x reward. "
        f"Mean ± 95% t-interval over seeds. Wall time {results.seconds['total']:.0f} s.", "",
        "![main](figures/main.png)", "",
        "## Exact values on the population", "",
        "| policy | value | donation | success |", "|---|---|---|---|",
    ]
    lines += [f"| {name} | {r['value']:.4f} | ${r['donation']:.3f} | {r['success']:.4f} |"
              for name, r in summary["references"].items()]
    lines += ["", "## Simulators after pretraining (on-policy with the pretrained agent, exact)", "",
              "| quantity | value |", "|---|---|",
              f"| deviation 1 - p_max: population (truth) | {mean_sd(pre['population_deviation'])} |",
              f"| deviation: base simulator, direct | {mean_sd(pre['base_deviation'])} |",
              f"| deviation: collapsed simulator, direct | {mean_sd(pre['collapsed_deviation'])} |",
              f"| deviation: collapsed simulator, verbalized | {mean_sd(pre['verbalized_deviation'])} |",
              f"| deviation: tabular collapsed simulator (reference) | "
              f"{mean_sd(pre['tabular_collapsed_deviation'])} |",
              f"| TV base (no card) vs population | {mean_sd(pre['base_tv'])} |",
              f"| TV base with persona card vs persona (mean of 4) | {mean_sd(np.mean(pre['card_tv'], 1))} |",
              f"| TV verbalized (collapsed model) vs population | {mean_sd(pre['verbalized_tv'])} |",
              f"| TV collapsed vs tabular collapsed simulator | {mean_sd(pre['collapsed_tv_to_tabular'])} |",
              f"| malformed greedy verbalizations | {mean_sd(pre['verbalized_malformed'])} |",
              f"| population value of the best response to the base simulator | "
              f"{mean_sd(pre['base_best_response_value'])} |",
              f"| population value of the best response to the verbalized simulator | "
              f"{mean_sd(pre['verbalized_best_response_value'])} |",
              f"| pretrained agent: first-turn TV to P4G frequencies | "
              f"{mean_sd(pre['agent_first_turn_tv_to_p4g'])} |"]
    lines += [f"| held-out simulator {h} (prior {np.round(x['prior'], 2).tolist()}): TV to its population, "
              f"deviation | {x['tv_to_own_population']:.3f}, {x['deviation']:.3f} |"
              for h, x in enumerate(pre["heldout"])]
    cols = (("step/reward", "train reward"), ("heldout_value", "held-out value"),
            ("heldout_success", "held-out success"), ("heldout_donation", "donation $"),
            ("heldout_sims_value", "held-out sims value"), ("step/agent_entropy", "token entropy"),
            ("entropy_off_sim", "off-sim entropy"), ("sim_deviation", "sim deviation"),
            ("sim_variance_share", "sim variance share"), ("sim_side_variance", "sim-side variance"),
            ("step/zero_variance_groups", "zero-var groups"))
    lines += ["", "## Final numbers per arm", "", "| arm | " + " | ".join(c for _, c in cols) + " |",
              "|---" * (len(cols) + 1) + "|"]
    for name, arm in arms.items():
        present = lambda k: k if k in arm else {"step/reward": "train_value"}.get(k)
        cells = [fmt((arm[present(k)]["mean"], arm[present(k)]["ci95"])) if present(k) in arm else "-"
                 for k, _ in cols]
        lines.append(f"| {summary['labels'][name]} | " + " | ".join(cells) + " |")
    lines += ["", "Train reward: mean over the last evaluation interval of steps (untrained: its exact value "
              "on the collapsed simulator). Held-out and simulator columns: the last exact evaluation. "
              "Token entropy: the train step's mean entropy of the agent's act distribution at its sampled "
              "decisions; off-sim entropy: exact, over the states the population reaches more often than the "
              "training simulators (evaluate.py).", ""]
    if summary["deltas_over_frozen"]:
        lines += ["## Fixes over the single frozen simulator (paired by seed)", "",
                  "| fix | Δ held-out value | Δ success | Δ donation $ | Δ held-out sims value "
                  "| Δ off-sim entropy |",
                  "|---|---|---|---|---|---|"]
        for fix, d in summary["deltas_over_frozen"].items():
            cells = [fmt((d[k]["mean"], d[k]["ci95"])) for k in
                     ("heldout_value", "heldout_success", "heldout_donation", "heldout_sims_value",
                      "entropy_off_sim")]
            lines.append(f"| {summary['labels'][fix]} | " + " | ".join(cells) + " |")
    lines += ["", "## What appeared", ""] + [f"- {x}" for x in _findings(results, summary)]
    best = max(arms[a]["heldout_value"]["mean"] for a in arms)
    ceiling = summary["references"]["best adaptive"]["value"]
    lines.append(f"- No arm comes near the adaptive ceiling ({ceiling:.3f}); the best ends at {best:.3f}. "
                 f"Part of the gap is simulator fidelity: the best response to the base transformer "
                 f"simulator is worth {np.mean(pre['base_best_response_value']):.3f} on the population "
                 f"(seeds {', '.join(f'{x:.3f}' for x in pre['base_best_response_value'])}), "
                 f"to the verbalized one {np.mean(pre['verbalized_best_response_value']):.3f} "
                 f"(their replies after the persona-revealing inquiry are the least accurate); "
                 f"the rest is the short RL budget.")
    missing = [arms_lib.ARMS[a].label for a in arms_lib.ARMS if a not in results.arms]
    if missing:
        lines.append(f"- Not run in this configuration: {', '.join(missing)}.")
    lines.append("- Self-play is not part of this testbed: the agent model would need simulator pretraining "
                 "(cards, replies) as well, which does not fit the CPU budget.")
    lines += ["", "## Wall time (s)", "", "| phase | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in results.seconds.items()]
    lines += ["", "Per-metric figures: `figures/metric_*.png`; every curve point per seed: `metrics.jsonl`."]
    return "\n".join(lines)
