"""Proposition 3.6: deployment regret bounds, the population deviation bound, the shortcut-vs-robust flip."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from theory_cases import BANDIT_SHAPE, PROPERTY, instances, shortcut_problem

from theory import checks, regret, toy

_bounds = jax.jit(regret.regret_bounds)
_trained = jax.jit(lambda values: regret.trained_policy(values, 0.5, 0.1, 100))


@PROPERTY
@given(instances(BANDIT_SHAPE), st.floats(0.0, 40.0), st.integers(0, 2**32 - 1))
def test_regret_between_its_bounds(case, deployment_scale, seed):
    logits, games, r_min, r_max = case
    scales = np.full(len(games.rho), deployment_scale)
    deployment = toy.random_games(np.random.default_rng(seed), BANDIT_SHAPE, scales).sim
    v_dep = toy.one_turn_values(games._replace(sim=deployment))
    _, _, mask, _, _ = shortcut_problem(games, r_min, r_max)
    r = _bounds(jax.nn.softmax(logits[0], axis=-1), v_dep, mask, r_max - r_min)
    assert checks.max_ratio(checks.lower_ratio(r.lower, r.regret)) <= 1.0
    assert checks.max_ratio(checks.upper_ratio(r.regret, r.upper)) <= 1.0


@PROPERTY
@given(st.integers(0, 2**32 - 1), st.integers(4, 6), st.data())
def test_population_with_different_modes_deviates(seed, replies, data):
    size = data.draw(st.integers(2, replies))
    sims, eps = regret.random_populations(np.random.default_rng(seed), 64, size, replies)
    mixture_eps = regret.deviation(sims.mean(axis=1))
    assert checks.max_ratio(checks.lower_ratio(regret.population_deviation_bound(eps), mixture_eps)) <= 1.0


@PROPERTY
@given(st.floats(0.4, 0.9))
def test_verbalized_sampling_flips_to_robust_above_1_minus_c(c):
    eps = np.linspace(0.0, 2 / 3, 25)
    values = regret.toy_values(regret.verbalized(1.0 - eps, 3), c)
    robust = np.asarray(_trained(values))[:, regret.ROBUST]
    decided = np.abs(eps - (1 - c)) > 1e-9
    np.testing.assert_array_equal((robust > 0.5)[decided], (eps > 1 - c)[decided])


def test_population_of_different_modes_flips_a_collapsed_simulator():
    c = 0.6
    single, pair = (regret.population(jnp.arange(k), jnp.full(k, 0.05), 3).mean(axis=0) for k in (1, 2))
    assert _trained(regret.toy_values(single, c))[regret.ROBUST] < 0.5
    assert regret.deviation(pair) > 1 - c
    assert _trained(regret.toy_values(pair, c))[regret.ROBUST] > 0.5


def test_population_bound_fails_when_modes_coincide():
    """Broken hypothesis: pairwise different modes. K copies of one collapsed simulator stay collapsed."""
    sims = regret.population(jnp.zeros(3, int), jnp.full(3, 0.05), 3)
    assert checks.lower_ratio(regret.population_deviation_bound(jnp.full(3, 0.05)),
                              regret.deviation(sims.mean(axis=0))) > 1.0


def test_matching_upper_bound_fails_when_shortcuts_differ_for_deployment_users():
    """Broken hypothesis: Gamma'_x = Gamma_x. pi sits on the worse of two shortcut actions."""
    pi, v_dep, mask = jnp.array([0.0, 1.0, 0.0]), jnp.array([0.5, 0.0, 1.0]), jnp.array([True, True, False])
    r = _bounds(pi, v_dep, mask, 1.0)
    gamma = 1.0 - 0.5
    assert checks.upper_ratio(r.regret, r.upper) <= 1.0
    assert checks.upper_ratio(r.regret, (1.0 - 0.0) * gamma) > 1.0
