"""Multi-turn agent-simulator RL on a text environment (scope_jax.training.train), with its curves."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scope_jax.training import config as rl_config  # noqa: E402
from scope_jax.training.run_dir import RunDir  # noqa: E402
from scope_jax.training.train import train  # noqa: E402

default_config = rl_config.default_config
schema = rl_config.schema
check = rl_config.check  # returns the simulator mode and the environment it built, which `run` is handed

CURVES = (("reward", "train reward"), ("heldout_reward", "held-out reward"),
          ("agent/entropy", "agent entropy"), ("agent/kl", "agent KL"),
          ("agent/clip_fraction", "clip fraction"), ("grad_norm", "grad norm"))
SUMMARY = ("reward", "heldout_reward", "agent/entropy", "monitor/zero_variance_groups", "time/step")


def plot_curves(run_dir: RunDir) -> None:
    records = run_dir.read_metrics()
    present = [(key, title) for key, title in CURVES if any(key in r for r in records)]
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 2.8), squeeze=False)
    for ax, (key, title) in zip(axes[0], present):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot(*zip(*points), marker="." if len(points) < 20 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    run_dir.save_figure(fig, "curves")


def run(config, run_dir: RunDir, checked: rl_config.Checked | None = None) -> None:
    _, last = train(config, run_dir, checked)
    plot_curves(run_dir)
    first = run_dir.read_metrics()[0]
    lines = ["# Dialogue RL", "", f"environment `{config.env.name}`, simulator mode `{config.sim.mode}`, "
             f"{config.train.steps} steps", "", "| metric | first step | last step |", "|---|---|---|"]
    for key in SUMMARY:
        if key in last:
            lines.append(f"| {key} | {first.get(key, float('nan')):.4g} | {last[key]:.4g} |")
    lines += ["", "![curves](figures/curves.png)"]
    run_dir.write_summary("\n".join(lines))
