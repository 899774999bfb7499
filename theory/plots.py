"""One figure per statement: bound against measured value, against the deviation eps or against steps."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


_MAX_POINTS = 3000  # scatter points per series


def _subsample(a: np.ndarray) -> np.ndarray:
    """At most _MAX_POINTS entries of a (flattened), evenly spread."""
    a = np.asarray(a).ravel()
    return a[np.linspace(0, a.size - 1, min(a.size, _MAX_POINTS)).astype(int)]


def _scatter_against_bound(ax, series: list[tuple[str, np.ndarray, np.ndarray]], xlabel: str, ylabel: str):
    """Measured against bound on log axes, with the line measured = bound."""
    lo, hi = np.inf, 0.0
    for label, bound, measured in series:
        keep = (bound > 0) & (measured > 0)
        bound, measured = _subsample(bound[keep]), _subsample(measured[keep])
        ax.scatter(bound, measured, s=4, alpha=0.4, label=label)
        lo, hi = min(lo, bound.min(), measured.min()), max(hi, bound.max(), measured.max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = bound")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=8)


def theorem_3_2(scatter: dict[int, tuple[np.ndarray, np.ndarray]], sweeps: dict[int, dict[str, np.ndarray]],
                dr: float):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    _scatter_against_bound(axes[0], [(f"T = {t}", b, m) for t, (b, m) in scatter.items()],
                           r"bound $\Delta r\,\sqrt{2T}\,\sum_t \bar\varepsilon_t$",
                           r"measured $\|\nabla J_\phi - \nabla J_{mode}\|$")
    axes[0].set_title("random instances: every point below the line")
    for t, sw in sweeps.items():
        (line,) = axes[1].plot(sw["eps"], sw["bias"], label=f"measured, T = {t}")
        axes[1].plot(sw["eps"], sw["bound"], "--", color=line.get_color(), label=f"bound, T = {t}")
        axes[2].plot(sw["eps"], sw["cosine"], color=line.get_color(), label=f"T = {t}")
    axes[1].set(xscale="log", yscale="log", xlabel=r"on-policy deviation $\sum_t \bar\varepsilon_t$",
                ylabel="gradient bias", title=r"bias is linear in $\varepsilon$ as $\varepsilon \to 0$")
    axes[2].set(xscale="log", xlabel=r"on-policy deviation $\sum_t \bar\varepsilon_t$",
                ylabel=r"cos($\nabla J_\phi$, $\nabla J_{mode}$)",
                title=r"cosine $\to 1$ as $\varepsilon \to 0$")
    for ax in axes[1:]:
        ax.legend(fontsize=8)
    fig.suptitle(f"Theorem 3.2: gradient bias against the mode user (dr = {dr:g}; sweep: phi moved toward "
                 "its mode user)")
    return fig


def lemma_3_3(scatter: list[tuple[np.ndarray, np.ndarray]], sweep: dict[str, np.ndarray], eps: np.ndarray,
              groups: dict[float, tuple[np.ndarray, np.ndarray]], group_size: int):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    _scatter_against_bound(axes[0], [(f"T = {i + 1}", b, m) for i, (b, m) in enumerate(scatter)],
                           r"bound $E[\varepsilon(h_t, a_t)\,|\,x]\;\Delta r^2$",
                           r"simulator-side term $E[\mathrm{Var}_u V_{t+1}\,|\,x]$")
    axes[0].set_title("per context and turn: every point below the line")
    sw = {k: np.asarray(v) for k, v in sweep.items()}
    axes[1].plot(sw["eps"], sw["simulator"], label="simulator side (measured)")
    axes[1].plot(sw["eps"], sw["bound"], "--", label=r"bound $\sum_t \bar\varepsilon_t \Delta r^2$")
    axes[1].plot(sw["eps"], sw["agent"], label="agent side")
    axes[1].set(xscale="log", yscale="log",
                xlabel=r"on-policy deviation $\sum_t \bar\varepsilon_t$ (context 0)",
                ylabel="variance", title="the simulator side vanishes with eps")
    axes[1].legend(fontsize=8)
    for c, (exact, lower) in groups.items():
        (line,) = axes[2].plot(eps, exact, label=rf"$\pi$(shortcut) = {c:g}")
        axes[2].plot(eps, lower, ":", color=line.get_color())
    axes[2].set(xscale="log", ylim=(0, 1.02), xlabel=r"simulator deviation $\varepsilon$",
                ylabel=f"P(zero reward variance), G = {group_size}",
                title="zero-variance GRPO groups (dotted: lower bound)")
    axes[2].legend(fontsize=8)
    fig.suptitle("Lemma 3.3: Var r = simulator side + agent side")
    return fig


def proposition_3_4(curves: dict[str, Any], beta: float, pg_log_odds: np.ndarray, rising: np.ndarray,
                    stuck: np.ndarray, dipped: np.ndarray):
    """curves: one context's mirror-descent log-odds gains, s, gap, eps_star, bound, and per target ("mode",
    "true") the pair (iterates, closed form). rising / stuck / dipped: contexts whose PG log-odds rise over
    the last quarter / do not / fell at first."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    steps = np.arange(len(curves["s"]))
    every = max(1, len(steps) // 25)
    for target, label in (("mode", r"vs mode user ($= s_t \Delta_x$)"), ("true", r"vs true $\phi$")):
        gain, closed = curves[target]
        (line,) = axes[0].plot(steps, closed, label=f"closed form {label}")
        axes[0].plot(steps[::every], gain[::every], "o", ms=4, color=line.get_color(),
                     label=f"iterates {label}")
    axes[0].plot(steps, curves["bound"], "k:", lw=1.5,
                 label=r"bound vs true $\phi$: $s_t(\Delta_x - 2\varepsilon^* \Delta r)$")
    axes[0].set(xlabel="mirror-descent step t", ylabel=r"min log-odds gain of $A_x$ over its complement",
                title=rf"mirror descent, $\beta$ = {beta:g}, $\Delta_x$ = {curves['gap']:.3f}, "
                      rf"$\varepsilon^*$ = {curves['eps_star']:.3f}")
    axes[0].legend(fontsize=8)

    step_axis = np.arange(1, len(pg_log_odds) + 1)
    groups = ((rising & dipped, 4, "-", "C0", "dipped, then rose"),
              (rising & ~dipped, 3, "-", "C1", "rose throughout"),
              (stuck, 2, "--", "grey", "still on a plateau at the end"))
    for select, count, style, color, label in groups:
        for k, (i, x) in enumerate(np.argwhere(select)[:count]):
            axes[1].plot(step_axis, pg_log_odds[:, i, x] - pg_log_odds[0, i, x], style, lw=1, color=color,
                         label=label if k == 0 else None)
    axes[1].axhline(0.0, color="k", lw=0.8)
    fraction = rising.sum() / (rising.sum() + stuck.sum())
    axes[1].set(xscale="log", xlabel="policy-gradient step + 1", ylabel=r"log-odds of $A_x$ minus its start",
                title=f"plain softmax PG: rising over the last quarter in {fraction:.0%} of contexts")
    axes[1].legend(fontsize=8)
    fig.suptitle(r"Proposition 3.4: $\log \pi_t(a)/\pi_t(b) = \log \pi_{ref}(a)/\pi_{ref}(b)"
                 r" + s_t (Q(a) - Q(b))$  (contexts with $\Delta_x > 2\varepsilon^*\Delta r$)")
    fig.tight_layout()
    return fig


def corollary_3_5(curves: dict[float, list[np.ndarray]]):
    """curves: per beta, one single-shortcut context's (1 - pi_t(A_x), its bound, H(pi_t), its bound)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for beta, (mass, dbar, entropy, entropy_bound) in curves.items():
        (line,) = axes[0].plot(mass, label=rf"measured, $\beta$ = {beta:g}")
        axes[0].plot(dbar, "--", color=line.get_color(), label=rf"bound, $\beta$ = {beta:g}")
        axes[1].plot(entropy, color=line.get_color(), label=rf"measured, $\beta$ = {beta:g}")
        axes[1].plot(entropy_bound, "--", color=line.get_color(), label=rf"bound, $\beta$ = {beta:g}")
    axes[0].set(yscale="log", xlabel="mirror-descent step t", ylabel=r"$1 - \pi_t(A_x)$",
                title=r"bound $\frac{\pi_{ref}(\neg A_x)}{\pi_{ref}(A_x)}"
                      r" e^{-(\Delta_x - 2\varepsilon^*\Delta r) s_t}$")
    axes[1].set(yscale="log", xlabel="mirror-descent step t", ylabel="entropy (nats)",
                title=r"$|A_x| = 1$: the entropy bound $\to 0$ when $\beta = 0$")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("Corollary 3.5: geometric concentration on the shortcut set "
                 "(training against the true simulator)")
    fig.tight_layout()
    return fig


def proposition_3_6(random_regret, vs_eps: np.ndarray, vs_robust: np.ndarray, population: dict[int, dict],
                    toy_regret, toy) -> Any:
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    threshold = 1.0 - toy.robust_payoff
    axes[0].plot(vs_eps, vs_robust, label=r"Verbalized Sampling ($\varepsilon = 1 - p_{max}$)")
    for size, p in population.items():
        axes[0].plot(p["deviation"], p["pi_robust"], "s", ms=8, label=f"population K = {size}")
    axes[0].axvline(threshold, color="k", ls="--", lw=1, label=r"$\varepsilon = 1 - c$")
    axes[0].axvspan(0, threshold / 2, color="grey", alpha=0.15,
                    label=r"Prop. 3.4 guarantees the shortcut ($\varepsilon < (1 - c)/2$)")
    axes[0].set(xlabel=r"training simulator's deviation $\varepsilon$", ylabel=r"learned $\pi$(robust)",
                title=f"shortcut (pays 1 if the user complies) vs robust (pays c = {toy.robust_payoff:g})")
    axes[0].legend(fontsize=7)
    axes[1].plot(vs_eps, toy_regret.regret, label="deployment regret")
    axes[1].plot(vs_eps, toy_regret.lower, "--", label=r"lower $(1 - \alpha)\Gamma$")
    axes[1].plot(vs_eps, toy_regret.upper, ":", label=r"upper $(1 - \alpha)\Gamma' + \alpha \Delta r$")
    axes[1].set(xlabel=r"training simulator's deviation $\varepsilon$ (Verbalized Sampling)", ylabel="regret",
                title=f"deployment users comply with probability {toy.deployment_comply:g}")
    axes[1].legend(fontsize=8)
    regret = _subsample(random_regret.regret)
    axes[2].scatter(regret, _subsample(random_regret.upper), s=4, alpha=0.4,
                    label=r"upper $(1 - \alpha)\Gamma' + \alpha \Delta r$")
    axes[2].scatter(regret, _subsample(random_regret.lower), s=4, alpha=0.4,
                    label=r"lower $(1 - \alpha)\Gamma$")
    axes[2].plot([0, regret.max()], [0, regret.max()], "k--", lw=1, label="bound = regret")
    axes[2].set(xlabel="measured deployment regret", ylabel="bound",
                title="random instances along training: lower below, upper above")
    axes[2].legend(fontsize=8)
    fig.suptitle("Proposition 3.6: regret on deployment users, and two fixes that raise the deviation")
    return fig
