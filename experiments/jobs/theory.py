"""Job `theory`: check the paper's statements (our formalization, theory/README.md) exactly on toy models.

Every check draws random instances with numpy, evaluates the exact quantities with JAX (vmapped over the
instances, float64), and writes one figure per statement plus checks.json:
{statement: {"instances", "max_ratio", "holds", "claims", ...}} with ratio = measured / bound
(bound / measured for lower bounds), so a statement holds when max_ratio <= 1 and its claims are true.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from scope_jax.config import ConfigError, at_least, require
from theory import checks, concentration, entropy_collapse, gradient_bias, plots, regret, toy, variance_split

matplotlib.use("Agg")


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "theory"
    c.seed = 0
    c.instances = 1000  # random instances per check (per horizon for Theorem 3.2 and Lemma 3.3)
    c.r_min = 0.0
    c.r_max = 1.0
    c.sim_scale = (0.3, 10.0)  # simulator logits scale * N(0, 1), scale log-uniform here (large: eps -> 0)
    c.policy_scale = (0.0, 3.0)  # agent logits scale * N(0, 1), scale uniform here (large: pi peaked)
    c.sweep_points = 25  # grid of the eps -> 0 sweeps
    # Theorem 3.2 and Lemma 3.3: multi-turn dialogues, exactly enumerated.
    c.dialogue = ml_collections.ConfigDict(dict(contexts=2, actions=3, replies=2, horizons=(1, 2, 3)))
    c.group_size = 8  # GRPO group size G (Lemma 3.3)
    # Propositions 3.4, 3.6 and Corollary 3.5: one-turn contextual bandits.
    c.bandit = ml_collections.ConfigDict(dict(contexts=2, actions=5, replies=3, shortcut_tolerance=0.05,
                                              sim_scale=(1.0, 30.0)))
    c.md = ml_collections.ConfigDict(dict(eta=0.5, betas=(0.0, 0.1), steps=200))  # mirror descent
    c.pg = ml_collections.ConfigDict(dict(eta=0.4, steps=4000))  # plain softmax policy gradient
    # Proposition 3.6's shortcut-vs-robust toy: the robust action pays robust_payoff (c); deployment users
    # comply with probability deployment_comply; each simulator of a population deviates with population_eps.
    c.toy = ml_collections.ConfigDict(dict(robust_payoff=0.6, deployment_comply=0.3, replies=3,
                                           population_eps=0.05, grid=41))
    return c


# Instances, grid points, sizes and steps: with a count of 0 a statement has nothing to check (or fails on
# empty arrays after the run directory exists).
RULES = {key: at_least(1) for key in (
    "instances", "sweep_points", "group_size", "dialogue.contexts", "dialogue.actions", "dialogue.replies",
    "bandit.contexts", "bandit.actions", "bandit.replies", "md.steps", "pg.steps", "toy.replies", "toy.grid")}


def check(config: ml_collections.ConfigDict) -> None:
    require(config, RULES)
    if config.r_max <= config.r_min:
        raise ConfigError("config key 'r_max' must exceed 'r_min'")
    if any(t < 1 for t in config.dialogue.horizons):
        raise ConfigError("config key 'dialogue.horizons' must hold horizons >= 1")
    if not 0.0 < config.toy.robust_payoff < 1.0:
        raise ConfigError("config key 'toy.robust_payoff' must lie in (0, 1)")
    if 0.0 not in config.md.betas or any(not 0.0 <= b * config.md.eta <= 1.0 for b in config.md.betas):
        raise ConfigError("config key 'md.betas' must include 0.0 (where entropy collapses) and satisfy "
                          "0 <= eta * beta <= 1")


def run(config: ml_collections.ConfigDict, run_dir) -> None:
    """Each statement gets (config, rng, bandit), bandit being the one-turn games shared by 3.4 to 3.6."""
    rng = np.random.default_rng(config.seed)
    statements = {
        "theorem_3_2": theorem_3_2,
        "lemma_3_3": lemma_3_3,
        "proposition_3_4": proposition_3_4,
        "corollary_3_5": corollary_3_5,
        "proposition_3_6": proposition_3_6,
    }
    results = {}
    with jax.enable_x64(True):
        bandit = _bandit(config, rng)
        for name, statement in run_dir.progress(statements.items(), desc="statements"):
            results[name], figure = statement(config, rng, bandit)
            run_dir.save_figure(figure, name)
    run_dir.log(0, {f"{name}/{key}": float(r[key]) for name, r in results.items()
                    for key in ("max_ratio", "holds")})
    run_dir.write_json("checks.json", results)
    run_dir.write_summary(_summary(results))


def _summary(results: dict[str, dict[str, Any]]) -> str:
    rows = "\n".join(
        f"| {name} | {r['instances']} | {r['max_ratio']:.15g} | {'yes' if r['holds'] else 'NO'} | "
        f"{', '.join(k for k, ok in r['claims'].items() if not ok) or '-'} |" for name, r in results.items())
    return ("# Theory checks\n\nExact evaluation on random toy instances; ratio = measured / bound "
            "(bound / measured for lower bounds). Statements: theory/README.md.\n\n"
            "| statement | instances | max ratio | holds | failed claims |\n|---|---|---|---|---|\n" + rows)


# --------------------------------------------------------------------------------------------- instances


def _scales(rng: np.random.Generator, n: int, log_uniform: tuple[float, float]) -> np.ndarray:
    """n scales drawn log-uniformly from the range."""
    lo, hi = log_uniform
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n))


def _dialogues(config, rng: np.random.Generator, horizon: int, binary: bool = False):
    """(logits, games) for config.instances random dialogues of this horizon."""
    d = config.dialogue
    shape = toy.Shape(d.contexts, d.actions, d.replies, horizon)
    games = toy.random_games(rng, shape, _scales(rng, config.instances, config.sim_scale), config.r_min,
                             config.r_max, binary)
    logits = toy.random_logits(rng, shape, rng.uniform(*config.policy_scale, config.instances))
    return logits, games


def _sweep(rng: np.random.Generator, config, horizon: int):
    """One random dialogue (simulator and policy scale 1) and deviation multipliers s in (0, 1]."""
    d = config.dialogue
    shape = toy.Shape(d.contexts, d.actions, d.replies, horizon)
    game = jax.tree.map(lambda a: a[0], toy.random_games(rng, shape, np.ones(1), config.r_min, config.r_max))
    logits = jax.tree.map(lambda a: a[0], toy.random_logits(rng, shape, np.ones(1)))
    return logits, game, np.logspace(-4, 0, config.sweep_points)


def _bandit(config, rng: np.random.Generator) -> dict[str, Any]:
    """Random one-turn games with their shortcut sets, and mirror-descent paths for each beta."""
    b, dr = config.bandit, config.r_max - config.r_min
    shape = toy.Shape(b.contexts, b.actions, b.replies, 1)
    games = toy.random_games(rng, shape, _scales(rng, config.instances, b.sim_scale), config.r_min,
                             config.r_max)
    log_ref = jax.nn.log_softmax(
        toy.random_logits(rng, shape, rng.uniform(*config.policy_scale, config.instances))[0], axis=-1)
    q = {"mode": toy.one_turn_values(games._replace(sim=toy.mode_user(games.sim))),
         "true": toy.one_turn_values(games)}
    mask = concentration.shortcut_set(q["mode"], b.shortcut_tolerance)
    gap = concentration.separation(q["mode"], mask)
    eps_star = toy.deviation(games.sim)[0].max(axis=-1)
    descend = jax.jit(concentration.mirror_descent, static_argnums=(3, 4, 5))
    t = np.arange(config.md.steps + 1)
    return jax.tree.map(np.asarray, dict(
        games=games, log_ref=log_ref, q=q, mask=mask, eps_star=eps_star,
        gap={"mode": gap, "true": gap - 2 * eps_star * dr},  # the gap each training target guarantees
        s={beta: concentration.strength(t, config.md.eta, beta) for beta in config.md.betas},
        paths={(beta, target): descend(log_ref, log_ref, q[target], config.md.eta, beta, config.md.steps)
               for beta in config.md.betas for target in q},
    ))


def _example(bandit: dict[str, Any], score: np.ndarray) -> tuple[int, int]:
    """(instance, context) with the highest score among those where Delta_x > 2 eps* dr."""
    score = np.where(concentration.positive_gap(bandit["gap"]["true"]), score, -np.inf)
    return np.unravel_index(np.argmax(score), score.shape)


# -------------------------------------------------------------------------------------------- statements


def theorem_3_2(config, rng: np.random.Generator, bandit) -> tuple[dict, Any]:
    """||grad J_phi - grad J_mode|| <= dr sqrt(2T) sum_t epsbar_t for each horizon; the eps -> 0 sweep."""
    dr = config.r_max - config.r_min
    evaluate = jax.jit(jax.vmap(lambda theta, game: (gradient_bias.bias(theta, game)[0],
                                                     gradient_bias.on_policy_deviation(theta, game),
                                                     gradient_bias.max_score_norm(theta))))
    per_horizon, scatter, sweeps = {}, {}, {}
    score_ratio, slopes, cosines = 0.0, {}, {}
    for horizon in config.dialogue.horizons:
        logits, games = _dialogues(config, rng, horizon)
        measured, epsbar, score = evaluate(logits, games)
        bound = gradient_bias.bound(epsbar, dr)
        per_horizon[horizon] = checks.max_ratio(checks.upper_ratio(measured, bound))
        g_t = gradient_bias.score_norm_bound(horizon)
        score_ratio = max(score_ratio, checks.max_ratio(checks.upper_ratio(score, g_t)))
        scatter[horizon] = (np.asarray(bound), np.asarray(measured))

        logits, game, s = _sweep(rng, config, horizon)
        bias, cosine, epsbar = jax.jit(jax.vmap(lambda si: _toward_mode_bias(logits, game, si)))(s)
        sweeps[horizon] = dict(eps=np.asarray(epsbar.sum(-1)), bias=np.asarray(bias),
                               bound=np.asarray(gradient_bias.bound(epsbar, dr)), cosine=np.asarray(cosine))
        small = slice(0, 5)
        slopes[horizon] = float(np.polyfit(np.log(sweeps[horizon]["eps"][small]),
                                           np.log(sweeps[horizon]["bias"][small]), 1)[0])
        cosines[horizon] = float(cosine[0])

    sharp_p, sharp_eps = 0.01, 0.3
    logits, game = gradient_bias.sharp_instance(sharp_p, sharp_eps, dr)
    sharp = float(gradient_bias.bias(logits, game)[0]
                  / gradient_bias.bound(gradient_bias.on_policy_deviation(logits, game), dr))
    entry = checks.entry(
        max(per_horizon.values()), config.instances * len(config.dialogue.horizons),
        claims={"score_norm_within_G_T": score_ratio <= 1.0 + checks.RTOL,
                "bias_linear_as_eps_to_0": all(abs(v - 1.0) < 0.05 for v in slopes.values()),
                "cosine_to_1_as_eps_to_0": all(v > 0.999 for v in cosines.values())},
        max_ratio_per_horizon=per_horizon, score_norm_max_ratio=score_ratio, loglog_slope_small_eps=slopes,
        cosine_at_smallest_eps=cosines, one_turn_sharp_instance_ratio=sharp,
        one_turn_sharp_instance_p=sharp_p)
    return entry, plots.theorem_3_2(scatter, sweeps, dr)


def _toward_mode_bias(logits, game, s):
    """Bias, cosine and per-turn epsbar against (1 - s) * mode user + s * phi."""
    game = game._replace(sim=toy.toward_mode(game.sim, s))
    bias, cosine = gradient_bias.bias(logits, game)
    return bias, cosine, gradient_bias.on_policy_deviation(logits, game)


def lemma_3_3(config, rng: np.random.Generator, bandit) -> tuple[dict, Any]:
    """Var r = simulator side + agent side (per turn), simulator side <= eps dr^2, zero-variance groups."""
    dr, g = config.r_max - config.r_min, config.group_size
    evaluate = jax.jit(jax.vmap(lambda theta, game: (variance_split.split(theta, game),
                                                     variance_split.simulator_bound(theta, game, dr))))
    zero_variance = jax.jit(jax.vmap(lambda theta, game: (
        variance_split.zero_variance_probability(theta, game, g, config.r_min, config.r_max),
        variance_split.zero_variance_lower_bound(theta, game, g))))
    identity_error, simulator_ratio, zero_ratio, scatter = 0.0, 0.0, 0.0, []
    for horizon in config.dialogue.horizons:
        split, bound = evaluate(*_dialogues(config, rng, horizon))
        identity_error = max(identity_error, float(jnp.max(jnp.abs(
            split.total - split.agent.sum(-1) - split.simulator.sum(-1)))))
        simulator_ratio = max(simulator_ratio, checks.max_ratio(checks.upper_ratio(split.simulator, bound)))
        scatter.append((np.asarray(bound).ravel(), np.asarray(split.simulator).ravel()))
        exact, lower = zero_variance(*_dialogues(config, rng, horizon, binary=True))
        zero_ratio = max(zero_ratio, checks.max_ratio(checks.lower_ratio(lower, exact)))

    logits, game, s = _sweep(rng, config, max(config.dialogue.horizons))
    sweep = jax.jit(jax.vmap(lambda si: _toward_mode_split(logits, game, si, dr)))(s)

    eps = np.logspace(-3, np.log10(0.5), config.sweep_points)
    concentrations = np.array([0.25, 0.5, 0.9, 0.99])
    grid = jax.vmap(jax.vmap(lambda e, c: _group_toy(e, c, g, config), (0, None)), (None, 0))
    exact, lower = jax.jit(grid)(eps, concentrations)
    groups = {float(c): (np.asarray(exact[k]), np.asarray(lower[k])) for k, c in enumerate(concentrations)}
    entry = checks.entry(
        max(simulator_ratio, zero_ratio), config.instances * len(config.dialogue.horizons) * 2,
        claims={"variance_identity_within_1e-10": identity_error <= 1e-10},
        variance_identity_max_abs_error=identity_error, simulator_side_max_ratio=simulator_ratio,
        zero_variance_lower_bound_max_ratio=zero_ratio, group_size=g)
    return entry, plots.lemma_3_3(scatter, sweep, eps, groups, g)


def _toward_mode_split(logits, game, s, dr):
    """Context 0's simulator side, its bound, agent side and deviation against (1 - s) mode + s phi."""
    game = game._replace(sim=toy.toward_mode(game.sim, s))
    split = variance_split.split(logits, game)
    bound = variance_split.simulator_bound(logits, game, dr)
    return dict(eps=bound[0].sum() / dr**2, simulator=split.simulator[0].sum(), bound=bound[0].sum(),
                agent=split.agent[0].sum())


def _group_toy(eps, concentration_, group_size, config):
    """(exact, lower bound) zero-variance probability of variance_split.shortcut_group_game."""
    logits, game = variance_split.shortcut_group_game(eps, concentration_, actions=4, r_min=config.r_min,
                                                      r_max=config.r_max)
    return (variance_split.zero_variance_probability(logits, game, group_size, config.r_min, config.r_max)[0],
            variance_split.zero_variance_lower_bound(logits, game, group_size)[0])


def proposition_3_4(config, rng: np.random.Generator, bandit) -> tuple[dict, Any]:
    """Mirror-descent iterates = closed form; log-odds gains >= s_t * gap; softmax PG's log-odds rise."""
    log_ref, mask, gap = bandit["log_ref"], bandit["mask"], bandit["gap"]
    beta_plot = config.md.betas[-1]
    i, x = _example(bandit, gap["true"] * bandit["eps_star"])  # the two bounds differ visibly
    curves = dict(s=bandit["s"][beta_plot], gap=gap["mode"][i, x], eps_star=bandit["eps_star"][i, x],
                  bound=bandit["s"][beta_plot] * gap["true"][i, x])
    closed_error, ratio = 0.0, {}
    for (beta, target), path in bandit["paths"].items():
        s = bandit["s"][beta]
        error, gain, closed_gain = _mirror_descent_gains(path, log_ref, bandit["q"][target], mask, s)
        closed_error = max(closed_error, float(error))
        applies = concentration.positive_gap(gap[target]) & (s[:, None, None] > 0)  # steps t >= 1
        r = checks.max_ratio(checks.lower_ratio(s[:, None, None] * gap[target], gain), applies)
        ratio[target] = max(ratio.get(target, -np.inf), r)
        if beta == beta_plot:
            curves[target] = (np.asarray(gain)[:, i, x], np.asarray(closed_gain)[:, i, x])

    hypothesis = np.asarray(concentration.positive_gap(gap["true"]))
    pg = jax.jit(concentration.softmax_pg, static_argnums=(3, 4))(
        log_ref, bandit["q"]["true"], mask, config.pg.eta, config.pg.steps)
    log_odds, certified = np.asarray(pg.log_odds), np.asarray(pg.certified)
    change = np.diff(log_odds, axis=0)
    certificate_sound = bool(np.all(change[certified] > -checks.ATOL))  # no fall beyond round-off
    tail = slice(3 * config.pg.steps // 4, None)
    rising, dipped = np.all(change[tail] > 0, axis=0), np.min(log_odds, axis=0) < log_odds[0]
    entry = checks.entry(
        max(ratio.values()), config.instances,
        claims={"mirror_descent_matches_closed_form": closed_error <= 1e-9,
                "pg_certified_steps_raise_log_odds": certificate_sound},
        closed_form_max_abs_error=closed_error, mode_user_gain_max_ratio=ratio["mode"],
        true_simulator_gain_max_ratio=ratio["true"], contexts=int(hypothesis.size),
        contexts_with_gap_above_2_eps_dr=int(hypothesis.sum()), pg_steps=config.pg.steps,
        pg_fraction_rising_over_last_quarter=float(rising[hypothesis].mean()),
        pg_fraction_certified_over_last_quarter=float(np.all(certified[tail], axis=0)[hypothesis].mean()),
        pg_fraction_dipping_first=float(dipped[hypothesis].mean()))
    return entry, plots.proposition_3_4(curves, beta_plot, log_odds, hypothesis & rising,
                                        hypothesis & ~rising, hypothesis & dipped)


@jax.jit
def _mirror_descent_gains(path, log_ref, q, mask, s):
    """(max |iterates - closed form|, smallest log-odds gain of A_x over its complement [steps + 1, n, X],
    the same gain from the closed form, s_t min_{a in A, b not in A} (Q(a) - Q(b)))."""
    error = jnp.max(jnp.abs(path - concentration.closed_form(log_ref, q, s)))
    gain = concentration.separation(path - log_ref, mask)
    return error, gain, s[:, None, None] * concentration.separation(q, mask)


def corollary_3_5(config, rng: np.random.Generator, bandit) -> tuple[dict, Any]:
    """1 - pi_t(A_x) <= [pi_ref(not A) / pi_ref(A)] exp(-gap s_t) and the entropy bound, every iterate."""
    log_ref, mask, gap = bandit["log_ref"], bandit["mask"], bandit["gap"]
    mass_ratio, entropy_ratio = -np.inf, -np.inf
    i, x = _example(bandit, np.where(mask.sum(-1) == 1, gap["true"], -np.inf))
    curves = {}
    for (beta, target), path in bandit["paths"].items():
        mass, dbar, h, h_bound = _concentration_and_entropy(path, log_ref, mask, gap[target],
                                                            bandit["s"][beta])
        applies = np.broadcast_to(concentration.positive_gap(gap[target]), path.shape[:-1])
        mass_ratio = max(mass_ratio, checks.max_ratio(checks.upper_ratio(mass, dbar), applies))
        entropy_ratio = max(entropy_ratio, checks.max_ratio(checks.upper_ratio(h, h_bound), applies))
        if target == "true":
            curves[beta] = [np.asarray(a)[:, i, x] for a in (mass, dbar, h, h_bound)]
        if (beta, target) == (0.0, "mode"):
            final_entropy_bound = np.asarray(h_bound)[-1]
    single = (mask.sum(-1) == 1) & np.asarray(concentration.positive_gap(gap["mode"]))
    entry = checks.entry(
        max(mass_ratio, entropy_ratio), config.instances,
        outside_mass_max_ratio=mass_ratio, entropy_max_ratio=entropy_ratio,
        beta_0_single_shortcut_final_entropy_bound_median=float(np.median(final_entropy_bound[single])))
    return entry, plots.corollary_3_5(curves)


@jax.jit
def _concentration_and_entropy(path, log_ref, mask, gap, s):
    """(1 - pi_t(A_x), its bound dbar_t, H(pi_t), its bound) along a path [steps + 1, n, X, A]."""
    dbar = entropy_collapse.outside_mass_bound(log_ref, mask, gap, s[:, None, None])
    return (entropy_collapse.outside_mass(path, mask), dbar, entropy_collapse.entropy(path),
            entropy_collapse.entropy_bound(dbar, mask))


def proposition_3_6(config, rng: np.random.Generator, bandit) -> tuple[dict, Any]:
    """Deployment regret bounds, the population deviation bound, and the shortcut-vs-robust toy's flip."""
    dr, b, t = config.r_max - config.r_min, config.bandit, config.toy
    shape = toy.Shape(b.contexts, b.actions, b.replies, 1)
    deployment = toy.random_games(rng, shape, _scales(rng, config.instances, config.sim_scale)).sim
    v_dep = toy.one_turn_values(bandit["games"]._replace(sim=deployment))
    # every iterate of training against phi, from the random pi_ref on: [steps + 1, n, X, A]
    bounds = jax.jit(regret.regret_bounds)
    r = bounds(np.exp(bandit["paths"][(0.0, "true")]), v_dep, bandit["mask"], dr)
    lower = checks.max_ratio(checks.lower_ratio(r.lower, r.regret))
    upper = checks.max_ratio(checks.upper_ratio(r.regret, r.upper))
    population_ratio = -np.inf
    for size in range(2, t.replies + 1):
        sims, eps = regret.random_populations(rng, config.instances, size, t.replies)
        population_ratio = max(population_ratio, checks.max_ratio(checks.lower_ratio(
            regret.population_deviation_bound(eps), regret.deviation(sims.mean(axis=1)))))

    @jax.jit
    def robust_probability(reply_probs):
        values = regret.toy_values(reply_probs, t.robust_payoff)
        pi = regret.trained_policy(values, config.md.eta, config.md.betas[-1], config.md.steps)
        return pi[..., regret.ROBUST]

    threshold = 1.0 - t.robust_payoff
    vs_eps = np.linspace(0.0, 1.0 - 1.0 / t.replies, t.grid)
    vs_robust = np.asarray(robust_probability(regret.verbalized(1.0 - vs_eps, t.replies)))
    decided = vs_eps != threshold
    population = {}
    for size in range(1, t.replies + 1):
        eps = jnp.full(size, t.population_eps)
        mixture = regret.population(jnp.arange(size), eps, t.replies).mean(axis=0)
        population[size] = dict(deviation=float(regret.deviation(mixture)),
                                bound=float(regret.population_deviation_bound(eps)),
                                pi_robust=float(robust_probability(mixture)))
    deployment_values = np.array([t.deployment_comply, t.robust_payoff])
    toy_regret = bounds(np.stack([1.0 - vs_robust, vs_robust], axis=-1), deployment_values,
                        np.array([True, False]), dr)
    entry = checks.entry(
        max(lower, upper, population_ratio), config.instances,
        claims={
            "vs_prefers_robust_iff_eps_above_1_minus_c": bool(np.all(
                (vs_robust > 0.5)[decided] == (vs_eps > threshold)[decided])),
            "single_collapsed_simulator_prefers_shortcut": population[1]["pi_robust"] < 0.5,
            "population_prefers_robust_when_eps_above_1_minus_c": all(
                p["pi_robust"] > 0.5 for p in population.values() if p["deviation"] > threshold)},
        regret_lower_max_ratio=lower, regret_upper_max_ratio=upper,
        population_deviation_max_ratio=population_ratio,
        toy_robust_payoff=t.robust_payoff, toy_flip_threshold_eps=threshold, toy_population=population)
    return entry, plots.proposition_3_6(r, vs_eps, vs_robust, population, toy_regret, t)
