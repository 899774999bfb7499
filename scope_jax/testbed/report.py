"""The collapse experiment's report: figures, summary.json and summary.md (the page, with optional
sections such as the data curve's), written into the run directory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from scope_jax.testbed.arms import CONTROLS, MODES
from scope_jax.testbed.experiment import Results
from scope_jax.testbed.figures import EVAL_METRICS, STEP_METRICS, gradient_figure, main_figure, metric_figure
from scope_jax.testbed.gradients import GradientPanel
from scope_jax.testbed.prose import (PRETRAINING_ROWS, arm_label, arms_table, construction_paragraph,
                                     deltas_table, findings, fmt, sweep_table, table_lines)
from scope_jax.testbed.statistics import SWEEP_RULE, mean_ci, summarize
from scope_jax.training.run_dir import RunDir


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
            lines += [f"## Against the {arm_label(summary, control)} (paired by seed)", "",
                      *deltas_table(summary, control), ""]
    panel_columns = tuple((EVAL_METRICS[k], k, lambda s: fmt(mean_ci(s))) for k in GradientPanel.KEYS) + (
        ("sim deviation", "sim_deviation", lambda s: fmt(mean_ci(s))),)
    lines += ["## Gradient panel at the end (Theorem 3.2)", "",
              *arms_table(summary, panel_columns, [a for a in summary["arms"] if a != "untrained"]), ""]
    if summary["sweep"]:
        lines += ["## Co-Training sweep (from the collapsed simulator, anchored to its start)", "",
                  f"Rule, stated before the sweep was run: choose {SWEEP_RULE}.", "",
                  *sweep_table(summary), ""]
    for section in sections:
        if section.key in summary:
            lines += section.markdown(summary[section.key])
    lines += ["## Exact values on the population", "", *table_lines(
        ["policy", "value", "donation", "success"],
        [[name, f"{r['value']:.4f}", f"${r['donation']:.3f}", f"{r['success']:.4f}"]
         for name, r in summary["references"].items()]), ""]
    rows = [[label, mean_sd(reduce(pre[key]))] for label, key, reduce in PRETRAINING_ROWS if key in pre]
    rows += [[f"held-out simulator {h} (prior {np.round(x['prior'], 2).tolist()}): TV to its population, "
              f"deviation", f"{x['tv_to_own_population']:.3f}, {x['deviation']:.3f}"]
             for h, x in enumerate(pre["heldout"])]
    lines += ["## Simulators after pretraining (on-policy with the pretrained agent, exact)", "",
              *table_lines(["quantity", "value"], rows), ""]
    missing = [m for m in MODES if m not in summary["modes"].values()]
    if missing:
        lines += [f"Modes not run in this configuration: {', '.join(missing)}.", ""]
    seconds = [[k, f"{v:.1f}"] for k, v in results.seconds.items()]
    lines += ["## Wall time (s)", "", *table_lines(["phase", "seconds"], seconds), "",
              "Per-metric figures: `figures/metric_*.png`; every curve point per seed: `metrics.jsonl`."]
    return "\n".join(lines)


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
