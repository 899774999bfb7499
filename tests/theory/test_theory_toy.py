"""The exact tabular model against brute-force enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from theory_cases import BATCH, PROPERTY, dialogues

from theory import toy


def _brute_force_return(logits: toy.Tables, game: toy.Game) -> float:
    """J by an explicit loop over every trajectory (x, a_1, u_1, ..., a_T, u_T)."""
    pi = [np.asarray(p) for p in toy.policy(logits)]
    sim = [np.asarray(s) for s in game.sim]
    shape = np.asarray(game.reward).shape
    total = 0.0
    for index in itertools.product(*map(range, shape)):
        p = float(game.rho[index[0]])
        for t in range(len(pi)):
            history = index[: 1 + 2 * t]
            a, u = index[1 + 2 * t], index[2 + 2 * t]
            p *= pi[t][history + (a,)] * sim[t][history + (a, u)]
        total += p * float(game.reward[index])
    return total


def _first(tree):
    return jax.tree.map(lambda a: a[0], tree)


def test_expected_return_matches_brute_force():
    rng = np.random.default_rng(0)
    shape = toy.Shape(2, 2, 3, 2)
    game = _first(toy.random_games(rng, shape, np.ones(1)))
    logits = _first(toy.random_logits(rng, shape, np.ones(1)))
    assert abs(float(toy.expected_return(logits, game)) - _brute_force_return(logits, game)) < 1e-14


_totals = jax.jit(jax.vmap(lambda theta, game: (
    toy.turn_probs(toy.policy(theta), game.sim, game.rho)[1].sum(),
    toy.expected_return(theta, game),
    jnp.sum(game.rho * toy.backward_values(toy.policy(theta), game.sim, game.reward)[1][0]))))


@PROPERTY
@given(dialogues())
def test_probabilities_sum_to_one_and_values_agree(case):
    logits, games, _, _ = case
    mass, j, v0 = _totals(logits, games)
    np.testing.assert_allclose(mass, np.ones(BATCH), atol=1e-12)
    np.testing.assert_allclose(v0, j, atol=1e-12)


def test_toward_mode_keeps_modes_and_scales_deviation():
    rng = np.random.default_rng(1)
    game = _first(toy.random_games(rng, toy.Shape(2, 3, 4, 2), np.ones(1)))
    moved = toy.toward_mode(game.sim, 0.3)
    deviations = zip(toy.deviation(game.sim), toy.deviation(moved))
    for before, after, (e_before, e_after) in zip(game.sim, moved, deviations):
        np.testing.assert_array_equal(np.argmax(before, -1), np.argmax(after, -1))
        np.testing.assert_allclose(e_after, 0.3 * np.asarray(e_before), atol=1e-15)
