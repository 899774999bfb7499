"""Proposition 3.4: mirror descent's closed form, log-odds gains on the shortcut set, softmax PG."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from theory_cases import BANDIT_SHAPE, PROPERTY, instances, shortcut_problem

from theory import checks, concentration, toy

STEPS = 40
_descend = jax.jit(concentration.mirror_descent, static_argnames="steps")
_pg = jax.jit(concentration.softmax_pg, static_argnames="steps")


@PROPERTY
@given(instances(BANDIT_SHAPE), st.floats(0.1, 2.0), st.one_of(st.just(0.0), st.floats(0.01, 1.0)))
def test_mirror_descent_closed_form_and_log_odds_gains(case, eta, eta_beta):
    logits, games, r_min, r_max = case
    beta = eta_beta / eta
    log_ref = jax.nn.log_softmax(logits[0], axis=-1)
    q_mode, q_true, mask, gap, true_gap = shortcut_problem(games, r_min, r_max)
    s = concentration.strength(np.arange(STEPS + 1), eta, beta)
    for q, d in ((q_mode, gap), (q_true, true_gap)):
        path = _descend(log_ref, log_ref, q, eta, beta, steps=STEPS)
        assert float(jnp.max(jnp.abs(path - concentration.closed_form(log_ref, q, s)))) <= 1e-9
        gain = concentration.separation(path - log_ref, mask)
        applies = concentration.positive_gap(d) & (s[:, None, None] > 0)
        assert checks.max_ratio(checks.lower_ratio(s[:, None, None] * d, gain), applies) <= 1.0


@PROPERTY
@given(instances(BANDIT_SHAPE))
def test_softmax_pg_certified_steps_raise_log_odds(case):
    logits, games, r_min, r_max = case
    _, q_true, mask, _, _ = shortcut_problem(games, r_min, r_max)
    path = _pg(logits[0], q_true, mask, 0.4 / (r_max - r_min), steps=200)
    assert np.all(np.diff(path.log_odds, axis=0)[np.asarray(path.certified)] > -checks.ATOL)


def test_softmax_pg_log_odds_dip_then_rise():
    """A heavy non-shortcut action worth more than J at first: A_x's log-odds fall, then rise for good."""
    q = jnp.array([1.0, 0.7, 0.0, 0.0])
    path = _pg(jnp.log(jnp.array([0.05, 0.8, 0.075, 0.075])), q, q >= 0.95, 0.4, steps=1000)
    log_odds = np.asarray(path.log_odds)
    assert log_odds.min() < log_odds[0] - 0.3 and log_odds[-1] > log_odds[0] + 5
    assert np.all(np.diff(log_odds[200:]) > 0) and np.all(path.certified[200:])


def test_closed_form_fails_when_pi0_is_not_pi_ref():
    """Broken hypothesis: pi_0 = pi_ref."""
    q, log_ref = jnp.array([1.0, 0.5, 0.0]), jnp.log(jnp.full(3, 1 / 3))
    log_pi0 = jnp.log(jnp.array([0.1, 0.3, 0.6]))
    path = _descend(log_pi0, log_ref, q, 0.5, 0.2, steps=STEPS)
    s = concentration.strength(np.arange(STEPS + 1), 0.5, 0.2)
    assert float(jnp.max(jnp.abs(path - concentration.closed_form(log_ref, q, s)))) > 1e-2


def test_concentration_fails_when_gap_below_twice_the_deviation():
    """Broken hypothesis: Delta_x > 2 eps* dr. The shortcut is best for the mode user (1 vs 0.9, Delta = 0.1)
    but the simulator deviates after it with eps = 0.2 to a reply worth 0, so Q_phi = (0.8, 0.9)."""
    sim = jnp.array([[[0.8, 0.2], [1.0, 0.0]]])
    reward = jnp.array([[[1.0, 0.0], [0.9, 0.9]]])
    games = toy.Game(jnp.ones(1), (sim,), reward)
    q_mode, q_true, mask, gap, true_gap = shortcut_problem(games, 0.0, 1.0)
    assert mask.tolist() == [[True, False]] and float(true_gap[0]) < 0
    log_ref = jnp.log(jnp.full((1, 2), 0.5))
    path = _descend(log_ref, log_ref, q_true, 0.5, 0.0, steps=STEPS)
    gain = concentration.separation(path - log_ref, mask)
    s = concentration.strength(np.arange(STEPS + 1), 0.5, 0.0)
    assert checks.max_ratio(checks.lower_ratio(s[:, None] * gap, gain), s[:, None] > 0) > 1.0
    pg = _pg(log_ref, q_true, mask, 0.4, steps=200)
    assert pg.log_odds[-1, 0] < pg.log_odds[0, 0] - 1.0  # policy gradient leaves the shortcut set too
