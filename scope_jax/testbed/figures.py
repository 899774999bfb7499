"""The collapse experiment's figures: curves per arm with 95% t-bands over seeds."""

from __future__ import annotations

import math
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from scope_jax.testbed.arm_store import ArmResult  # noqa: E402
from scope_jax.testbed.experiment import Results  # noqa: E402

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
