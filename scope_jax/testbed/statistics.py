"""The collapse experiment's numbers over seeds: 95% t-intervals, summary.json (`summarize`).

"Final" numbers are the last exact evaluation (held-out value, success, donation, entropies, deviation,
variance share, gradient panel) and, for per-step curves (training reward, token entropy, zero-variance
groups), the mean over the last `eval_every` steps of each seed; "initial" ones the first evaluation
and the first `eval_every` steps. Every trained arm is compared with both controls, the frozen collapsed
simulator and the frozen base simulator, paired by seed (the arms share seeds, pretrained models and
rollout keys).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from scope_jax.testbed.arm_store import ArmResult
from scope_jax.testbed.arms import CONTROLS, Arm
from scope_jax.testbed.experiment import Results
from scope_jax.testbed.gradients import GradientPanel

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


def seed_stat(values) -> dict[str, Any]:
    """Mean, 95% t-interval half-width and the values of one number over seeds."""
    mean, hw = interval(values)
    return {"mean": mean, "ci95": hw, "seeds": np.asarray(values, np.float64).tolist()}


def mean_ci(stat: dict[str, Any]) -> tuple[float, float]:
    """(mean, 95% half-width) of a `seed_stat`."""
    return stat["mean"], stat["ci95"]


def direction(stat: dict[str, Any], up: str = "higher", down: str = "lower") -> str:
    """`up` / `down` when the 95% interval excludes 0, else "not distinguishable from 0"."""
    mean, hw = mean_ci(stat)
    if math.isnan(hw):
        return f"{up if mean > 0 else down} (one seed, no interval)"
    return up if mean - hw > 0 else down if mean + hw < 0 else "not distinguishable from 0"


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
    deltas = {control: {name: {k: seed_stat(finals[name][k] - finals[control][k]) for k in DELTA_METRICS}
                        for name in finals if name not in (control, "untrained")}
              for control in CONTROLS if control in finals}
    if "untrained" in finals:
        untrained = finals["untrained"]["heldout_value"]
        deltas["untrained"] = {name: {"heldout_value": seed_stat(f["heldout_value"] - untrained)}
                               for name, f in finals.items() if name != "untrained"}
    panel_change = {name: {k: seed_stat(f[k] - f[f"initial/{k}"]) for k in GradientPanel.KEYS}
                    for name, f in finals.items() if name != "untrained"}
    sweep = {arm.name: {"kl": arm.sim_kl_coef, "lr": arm.sim_learning_rate, "objective": arm.objective}
             for arm in results.settings.arms if arm.sim_kl_coef is not None}
    summary = {
        "arms": {name: {k: seed_stat(v) for k, v in f.items()} for name, f in finals.items()},
        "deltas": deltas, "panel_change": panel_change, "sweep": sweep, "sweep_rule": SWEEP_RULE,
        "references": results.references, "pretraining": results.pretraining, "seconds": results.seconds,
        "labels": {name: arm.label for name, arm in results.arms.items()},
        "modes": {name: arms_by_name[name].mode for name in results.arms},
        "seeds": list(results.settings.seeds), "rl": vars(results.settings.rl) | {},
        "pretrain": vars(results.settings.pretrain) | {}, "vs_samples": results.settings.vs_samples,
    }
    summary["sweep_choice"] = selected_sweep_point(summary)
    return summary
