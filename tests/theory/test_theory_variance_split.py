"""Lemma 3.3: Var r = simulator side + agent side, simulator side <= eps dr^2, zero-variance groups."""

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from theory_cases import BANDIT_SHAPE, PROPERTY, dialogues, instances

from theory import checks, toy, variance_split

_split = jax.jit(jax.vmap(lambda theta, game, dr: (
    variance_split.split(theta, game), variance_split.simulator_bound(theta, game, dr)),
    in_axes=(0, 0, None)))


@PROPERTY
@given(dialogues())
def test_doob_split_is_exact_and_simulator_side_bounded(case):
    logits, games, r_min, r_max = case
    split, bound = _split(logits, games, r_max - r_min)
    np.testing.assert_allclose(split.total, split.agent.sum(-1) + split.simulator.sum(-1), rtol=0, atol=1e-10)
    assert checks.max_ratio(checks.upper_ratio(split.simulator, bound)) <= 1.0


@PROPERTY
@given(instances(BANDIT_SHAPE))
def test_one_turn_form(case):
    """T = 1, written out: Var r = E_a[Var_u r] + Var_a[Q(x, a)], with numpy only."""
    logits, games, _, _ = case
    pi, (sim,), r = np.asarray(toy.policy(logits)[0]), games.sim, games.reward
    q = (sim * r).sum(-1)
    simulator = (pi * ((sim * r**2).sum(-1) - q**2)).sum(-1)
    agent = (pi * q**2).sum(-1) - (pi * q).sum(-1) ** 2
    total = (pi[..., None] * sim * r**2).sum((-1, -2)) - (pi * q).sum(-1) ** 2
    split, _ = _split(logits, games, 1.0)
    np.testing.assert_allclose(split.simulator[..., 0], simulator, atol=1e-12)
    np.testing.assert_allclose(split.agent[..., 0], agent, atol=1e-12)
    np.testing.assert_allclose(split.total, total, atol=1e-12)


_zero_variance = jax.jit(jax.vmap(lambda theta, game, size, lo, hi: (
    variance_split.zero_variance_probability(theta, game, size, lo, hi),
    variance_split.zero_variance_lower_bound(theta, game, size)), in_axes=(0, 0, None, None, None)),
    static_argnums=2)


@PROPERTY
@given(dialogues(binary=True), st.sampled_from([2, 8]))
def test_zero_variance_probability_above_its_lower_bound(case, group_size):
    logits, games, r_min, r_max = case
    exact, lower = _zero_variance(logits, games, group_size, r_min, r_max)
    assert checks.max_ratio(checks.lower_ratio(lower, exact)) <= 1.0


def test_zero_variance_tends_to_one_for_collapsed_simulator_and_policy():
    @jax.jit
    def probabilities(eps, concentration):
        logits, game = variance_split.shortcut_group_game(eps, concentration, 4, 0.0, 1.0)
        return (variance_split.zero_variance_probability(logits, game, 8, 0.0, 1.0)[0],
                variance_split.zero_variance_lower_bound(logits, game, 8)[0])

    exact, lower = probabilities(1e-9, 1 - 1e-9)
    assert exact > 1 - 1e-6 and lower > 1 - 1e-6


def test_fails_when_reward_leaves_the_declared_range():
    """Broken hypothesis: R in [r_min, r_max]. Rewards in {0, 3} checked with dr = 1."""
    rng = np.random.default_rng(0)
    shape = toy.Shape(2, 3, 2, 2)
    games = toy.random_games(rng, shape, np.ones(16), 0.0, 3.0, binary=True)
    logits = toy.random_logits(rng, shape, np.ones(16))
    split, bound = _split(logits, games, 1.0)
    assert checks.max_ratio(checks.upper_ratio(split.simulator, bound)) > 1.0


def test_fails_when_earlier_turns_are_dropped():
    """Broken hypothesis: one agent and one simulator term per turn; the last turn's alone miss Var r."""
    rng = np.random.default_rng(1)
    shape = toy.Shape(2, 3, 2, 2)
    games = toy.random_games(rng, shape, np.ones(16))
    split, _ = _split(toy.random_logits(rng, shape, np.ones(16)), games, 1.0)
    assert np.max(np.abs(split.total - split.agent[..., -1] - split.simulator[..., -1])) > 1e-3
