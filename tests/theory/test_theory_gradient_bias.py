"""Theorem 3.2: ||grad J_phi - grad J_mode|| <= dr sqrt(2T) sum_t epsbar_t."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from theory_cases import PROPERTY, dialogues

from theory import checks, gradient_bias, toy

_bias = jax.jit(gradient_bias.bias)
_epsbar = jax.jit(gradient_bias.on_policy_deviation)
_evaluate = jax.jit(jax.vmap(lambda theta, game: (
    gradient_bias.bias(theta, game)[0], gradient_bias.on_policy_deviation(theta, game),
    gradient_bias.max_score_norm(theta))))


@PROPERTY
@given(dialogues())
def test_bias_within_bound(case):
    logits, games, r_min, r_max = case
    measured, epsbar, _ = _evaluate(logits, games)
    assert checks.max_ratio(checks.upper_ratio(measured, gradient_bias.bound(epsbar, r_max - r_min))) <= 1.0


@PROPERTY
@given(dialogues())
def test_summed_score_norm_within_sqrt_2T(case):
    logits, games, _, _ = case
    _, _, score = _evaluate(logits, games)
    assert np.all(np.asarray(score) <= gradient_bias.score_norm_bound(len(games.sim)) + 1e-12)


def test_max_score_norm_matches_autodiff():
    """The closed form against the norm of jax.grad of sum_t log pi(a_t | h_t), trajectory by trajectory."""
    rng = np.random.default_rng(0)
    shape = toy.Shape(1, 3, 2, 2)
    logits = jax.tree.map(lambda a: a[0], toy.random_logits(rng, shape, np.full(1, 2.0)))

    def log_prob(theta):
        _, p = toy.turn_probs(toy.policy(theta), tuple(jnp.ones(s.shape + (2,)) for s in theta), jnp.ones(1))
        return jnp.log(p).ravel()  # replies are unweighted, so this is sum_t log pi(a_t | h_t)

    jacobian = jax.jit(jax.jacrev(log_prob))(logits)
    norms = jnp.sqrt(sum(jnp.sum(j.reshape(j.shape[0], -1) ** 2, axis=1) for j in jacobian))
    np.testing.assert_allclose(gradient_bias.max_score_norm(logits), norms.max(), rtol=1e-12)


def test_one_turn_form_is_sharp():
    for p in (0.5, 0.1, 0.01):
        logits, game = gradient_bias.sharp_instance(p, 0.3, 2.0)
        ratio = _bias(logits, game)[0] / gradient_bias.bound(_epsbar(logits, game), 2.0)
        np.testing.assert_allclose(ratio, 1.0 - p, rtol=1e-12)


def test_bias_linear_and_cosine_to_one_as_eps_vanishes():
    rng = np.random.default_rng(2)
    shape = toy.Shape(2, 3, 2, 2)
    game = jax.tree.map(lambda a: a[0], toy.random_games(rng, shape, np.ones(1)))
    logits = jax.tree.map(lambda a: a[0], toy.random_logits(rng, shape, np.ones(1)))
    (b1, _), (b2, cosine) = (_bias(logits, game._replace(sim=toy.toward_mode(game.sim, s)))
                             for s in (1e-4, 1e-5))
    np.testing.assert_allclose(b1 / b2, 10.0, rtol=1e-3)
    assert cosine > 1 - 1e-6


def test_fails_with_underestimated_deviation():
    """Broken hypothesis: a deviation below the true on-policy one (here half of it) on the sharp instance."""
    logits, game = gradient_bias.sharp_instance(0.1, 0.3, 1.0)
    measured, epsbar = _bias(logits, game)[0], _epsbar(logits, game)
    assert checks.upper_ratio(measured, gradient_bias.bound(epsbar, 1.0)) <= 1.0
    assert checks.upper_ratio(measured, gradient_bias.bound(epsbar / 2, 1.0)) > 1.0


def test_fails_when_earlier_turns_are_dropped():
    """Broken hypothesis: the sum over turns. Only turn 1 deviates; the last turn's deviation alone is 0."""
    rng = np.random.default_rng(3)
    shape = toy.Shape(2, 3, 2, 2)
    games = toy.random_games(rng, shape, np.ones(16))
    games = games._replace(sim=(games.sim[0], np.asarray(toy.mode_user(games.sim)[1])))
    measured, epsbar, _ = _evaluate(toy.random_logits(rng, shape, np.ones(16)), games)
    assert checks.max_ratio(checks.upper_ratio(measured, gradient_bias.bound(epsbar, 1.0))) <= 1.0
    assert checks.max_ratio(checks.upper_ratio(measured, gradient_bias.bound(epsbar[:, -1:], 1.0))) > 1.0
