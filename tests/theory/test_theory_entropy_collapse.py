"""Corollary 3.5: 1 - pi_t(A_x) <= [pi_ref(not A_x) / pi_ref(A_x)] exp(-gap s_t), and the entropy bound."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from theory_cases import BANDIT_SHAPE, PROPERTY, instances, shortcut_problem

from theory import checks, concentration, entropy_collapse, toy

STEPS = 60
_descend = jax.jit(concentration.mirror_descent, static_argnames="steps")


@jax.jit
def _mass_and_entropy(path, log_ref, mask, gap, s):
    dbar = entropy_collapse.outside_mass_bound(log_ref, mask, gap, s.reshape(s.shape + (1,) * gap.ndim))
    return (entropy_collapse.outside_mass(path, mask), dbar, entropy_collapse.entropy(path),
            entropy_collapse.entropy_bound(dbar, mask))


@PROPERTY
@given(instances(BANDIT_SHAPE), st.one_of(st.just(0.0), st.floats(0.01, 1.0)))
def test_mass_and_entropy_within_bounds_along_mirror_descent(case, beta):
    logits, games, r_min, r_max = case
    log_ref = jax.nn.log_softmax(logits[0], axis=-1)
    q_mode, q_true, mask, gap, true_gap = shortcut_problem(games, r_min, r_max)
    s = concentration.strength(np.arange(STEPS + 1), 1.0, beta)
    for q, d in ((q_mode, gap), (q_true, true_gap)):
        mass, dbar, h, h_bound = _mass_and_entropy(_descend(log_ref, log_ref, q, 1.0, beta, steps=STEPS),
                                                   log_ref, mask, d, s)
        applies = np.broadcast_to(concentration.positive_gap(d), mass.shape)
        assert checks.max_ratio(checks.upper_ratio(mass, dbar), applies) <= 1.0
        assert checks.max_ratio(checks.upper_ratio(h, h_bound), applies) <= 1.0


@jax.jit
def _entropy_and_grouping_bound(logits, mask):
    log_pi = jax.nn.log_softmax(logits)
    return (entropy_collapse.entropy(log_pi),
            entropy_collapse.entropy_bound(entropy_collapse.outside_mass(log_pi, mask), mask))


@PROPERTY
@given(st.lists(st.floats(-30.0, 30.0), min_size=5, max_size=5),
       st.lists(st.booleans(), min_size=5, max_size=5), st.integers(0, 4))
def test_entropy_grouping_bound_for_any_policy(logits, mask, member):
    """H(pi) <= f(min(d, d*)) with d = 1 - pi(A) itself, for any pi and any non-empty A."""
    mask[member] = True
    assert checks.upper_ratio(*_entropy_and_grouping_bound(jnp.array(logits), jnp.array(mask))) <= 1.0


def test_entropy_bound_vanishes_for_a_single_shortcut():
    mask = np.array([True, False, False, False])
    for dbar, limit in ((1e-3, 1e-2), (1e-9, 1e-7)):
        assert entropy_collapse.entropy_bound(jnp.array(dbar), mask) < limit


def test_mass_bound_fails_when_gap_below_twice_the_deviation():
    """Broken hypothesis: Delta_x > 2 eps* dr. Training against this simulator, A_x loses mass; the bound with
    the mode-user gap Delta_x = 0.1 fails."""
    sim = jnp.array([[[0.8, 0.2], [1.0, 0.0]]])
    reward = jnp.array([[[1.0, 0.0], [0.9, 0.9]]])
    _, q_true, mask, gap, _ = shortcut_problem(toy.Game(jnp.ones(1), (sim,), reward), 0.0, 1.0)
    log_ref = jnp.log(jnp.full((1, 2), 0.5))
    s = concentration.strength(np.arange(STEPS + 1), 1.0, 0.0)
    mass, dbar, _, _ = _mass_and_entropy(_descend(log_ref, log_ref, q_true, 1.0, 0.0, steps=STEPS), log_ref,
                                         mask, gap, s)
    assert checks.max_ratio(checks.upper_ratio(mass, dbar)) > 1.0


def test_entropy_collapse_fails_with_two_tied_shortcuts():
    """Broken hypothesis: |A_x| = 1. Two actions tie at the top, so pi_t tends to (1/2, 1/2, 0) and the
    entropy to log 2, above the |A_x| = 1 bound, which tends to 0."""
    q = jnp.array([1.0, 1.0, 0.0])
    true_mask, single = np.array([True, True, False]), np.array([True, False, False])
    log_ref = jnp.log(jnp.full(3, 1 / 3))
    s = concentration.strength(np.arange(STEPS + 1), 1.0, 0.0)
    path = _descend(log_ref, log_ref, q, 1.0, 0.0, steps=STEPS)
    _, dbar, h, _ = _mass_and_entropy(path, log_ref, true_mask, concentration.separation(q, true_mask), s)
    assert checks.max_ratio(checks.upper_ratio(h, entropy_collapse.entropy_bound(dbar, single))) > 1.0
    assert abs(float(h[-1]) - np.log(2)) < 1e-9
