"""Collapse monitor: hand-computed values, the exact split against Lemma 3.3, the branching estimator's
unbiasedness (and the naive estimator's bias) on a toy where the split is known, and its algebra."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from scope_jax.diagnostics import (
    VarianceSplit,
    branching_variance_split,
    distinct_n,
    grouped,
    identical_fraction,
    mode_deviation,
    sampled_entropy,
    simulator_deviation,
    zero_variance_fraction,
)
from theory import toy, variance_split

TERMS = ("simulator_side", "agent_side", "total")


def exact_variance_split(p_h, q, r) -> VarianceSplit:
    """The exact split of a finite toy, the reference of the branching estimator: p_h [H] law of the history,
    q [H, U] law of the reply given h, r [H, U] return of (h, u).

        Q(h) = sum_u q[h, u] r[h, u],   V = sum_h p_h Q(h),
        simulator_side = sum_h p_h sum_u q[h, u] (r[h, u] - Q(h))^2      = E_h[Var_u r],
        agent_side     = sum_h p_h (Q(h) - V)^2                          = Var_h Q(h),
        total          = sum_{h,u} p_h q[h, u] (r[h, u] - V)^2           = Var r,

    and total = simulator_side + agent_side (law of total variance). With h = the agent's action in
    context x this is Lemma 3.3 at T = 1. At simulator turn t of a longer dialogue (h = the history up to
    the agent's move a_t): take as "reply" u the whole continuation (u_t and everything after) to get what
    `branching_variance_split` estimates, or take r = the expected return given (h, u_t) to isolate the
    lemma's simulator term of turn t. Entries of r with zero probability are ignored.
    """
    p_h, q, r = (np.asarray(a, dtype=np.float64) for a in (p_h, q, r))
    if p_h.ndim != 1 or q.ndim != 2 or q.shape[0] != p_h.size or r.shape != q.shape:
        raise ValueError(f"expected p_h [H], q and r [H, U]; got {p_h.shape}, {q.shape}, {r.shape}")
    if not (np.isclose(p_h.sum(), 1.0) and np.allclose(q.sum(-1), 1.0)) or (p_h < 0).any() or (q < 0).any():
        raise ValueError("p_h and every row of q must be probability distributions")
    joint = p_h[:, None] * q
    # Centre on a reachable return: constant reachable returns then give exactly 0 (and a NaN share).
    r = np.where(joint > 0, r - r.flat[np.argmax(joint)], 0.0)
    qh = (q * r).sum(-1)
    v = p_h @ qh
    return VarianceSplit.of(simulator_side=(joint * (r - qh[:, None]) ** 2).sum(),
                            agent_side=p_h @ (qh - v) ** 2, total=(joint * (r - v) ** 2).sum())


def terms(split: VarianceSplit) -> np.ndarray:
    return np.array([getattr(split, t) for t in TERMS])


# ----------------------------------------------------------------------------------------- group metrics


def test_zero_variance_fraction():
    rewards = [1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 5.0]
    # groups 7 and 2 are constant, 0 is not, 9 has a single rollout (constant): 3 of 4
    assert zero_variance_fraction(rewards, [7, 7, 0, 0, 2, 2, 9]) == 0.75
    assert zero_variance_fraction(np.array([0.5, 0.5]), np.array(["a", "a"])) == 1.0
    assert math.isnan(zero_variance_fraction([], []))


def test_distinct_n():
    replies = [[1, 2, 3], [1, 2, 4]]
    assert distinct_n(replies, 1) == 4 / 6
    assert distinct_n(replies, 2) == 3 / 4  # (1,2) twice, (2,3), (2,4)
    assert distinct_n(replies, 3) == 1.0
    assert math.isnan(distinct_n(replies, 4))
    assert distinct_n([[1, 2, 3], [7]], 2) == 1.0  # [7] has no bigram
    assert math.isnan(distinct_n([[1], [1]], 2))  # n-grams never span two replies
    assert distinct_n(["the cat the cat".split()], 2) == 2 / 3
    assert distinct_n([np.array([5, 5, 5])], 1) == 1 / 3
    with pytest.raises(TypeError):
        distinct_n(["the cat"], 1)
    with pytest.raises(ValueError):
        distinct_n(replies, 0)


def test_identical_fraction():
    assert identical_fraction(["a", "a", "b"]) == 2 / 3
    assert identical_fraction(["a", "b", "c"]) == 0.0
    assert identical_fraction(["x", "x", "x"]) == 1.0
    assert identical_fraction(["a"]) == 0.0
    assert math.isnan(identical_fraction([]))
    # token sequences compare element-wise, whatever their container
    assert identical_fraction([[1, 2], (1, 2), np.array([1, 2]), [2, 1]]) == 3 / 4


def test_grouped():
    replies = ["a", "a", "b", "c", "d", "e"]
    assert grouped(identical_fraction, replies, [0, 0, 0, 1, 1, 1]) == pytest.approx((2 / 3 + 0) / 2)
    # every group counts once: a group of 3 all-equal replies and a single reply average to 1/2
    assert grouped(identical_fraction, ["a", "a", "a", "b"], [0, 0, 0, 1]) == 0.5
    # a group without bigrams (NaN) is left out; all left out -> NaN
    bigrams = functools.partial(distinct_n, n=2)
    assert grouped(bigrams, [[1, 1], [1, 1], [5], [6]], [0, 0, 1, 1]) == 0.5
    assert math.isnan(grouped(bigrams, [[5], [6]], [0, 1]))
    with pytest.raises(ValueError):
        grouped(identical_fraction, ["a"], [0, 1])


# ---------------------------------------------------------------------------- simulator deviation, entropy


def test_mode_deviation():
    assert mode_deviation("yes", ["yes", "no", "yes", "yes"]) == 0.25
    assert mode_deviation([1, 2], [np.array([1, 2]), (1, 2), [1, 3]]) == pytest.approx(1 / 3)
    assert mode_deviation("yes", ["no", "no"]) == 1.0
    assert math.isnan(mode_deviation("yes", []))


def test_simulator_deviation():
    assert simulator_deviation(["a", "b"], [["a", "a"], ["a", "b", "c", "d"]]) == (0.0 + 0.75) / 2
    assert simulator_deviation(["a", "b"], [["b"], []]) == 1.0  # a probe without samples is left out
    assert math.isnan(simulator_deviation([], []))
    with pytest.raises(ValueError):
        simulator_deviation(["a"], [])


def test_sampled_entropy_hand_values():
    half = np.full((2, 3), np.log(0.5))
    assert sampled_entropy(half, np.ones((2, 3))) == pytest.approx(np.log(2))
    # padding (even -inf) is masked out
    logprobs = np.array([[np.log(0.5), np.log(0.25), -np.inf]])
    assert sampled_entropy(logprobs, np.array([[1, 1, 0]])) == pytest.approx(1.5 * np.log(2))
    assert math.isnan(sampled_entropy(half, np.zeros((2, 3))))
    with pytest.raises(ValueError):
        sampled_entropy(half, np.ones((3, 2)))


def test_sampled_entropy_estimates_the_entropy_of_the_sampling_distribution():
    p = np.array([0.7, 0.2, 0.1])
    tokens = np.random.default_rng(0).choice(3, size=(200, 100), p=p)
    logprobs = np.log(p)[tokens]
    se = logprobs.std() / np.sqrt(logprobs.size)
    assert abs(sampled_entropy(logprobs, np.ones_like(logprobs)) - (-(p * np.log(p)).sum())) < 5 * se


# ------------------------------------------------------------------------------------- exact variance split


def test_exact_split_hand_toy():
    # h0: r in {0, 1} evenly (Q = 1/2, Var = 1/4); h1: r = 1 surely (the 7 has probability 0)
    split = exact_variance_split([0.5, 0.5], [[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0], [1.0, 7.0]])
    # simulator: 1/2 * 1/4; agent: Var of Q in {1/2, 1} evenly = 1/16; r = 1 w.p. 3/4: Var = 3/16
    assert terms(split) == pytest.approx([1 / 8, 1 / 16, 3 / 16])
    assert split.simulator_share == pytest.approx(2 / 3)


def test_exact_split_of_constant_returns_is_zero_with_nan_share():
    split = exact_variance_split([0.3, 0.7], [[0.1, 0.9], [0.4, 0.6]], np.full((2, 2), 0.1))
    assert terms(split).tolist() == [0.0, 0.0, 0.0] and math.isnan(split.simulator_share)


def test_exact_split_rejects_non_distributions():
    with pytest.raises(ValueError):
        exact_variance_split([0.5, 0.6], np.full((2, 2), 0.5), np.zeros((2, 2)))
    with pytest.raises(ValueError):
        exact_variance_split([0.5, 0.5], [[0.5, 0.5], [0.9, 0.2]], np.zeros((2, 2)))
    with pytest.raises(ValueError):
        exact_variance_split([1.0], np.ones((1, 2)) / 2, np.zeros((1, 3)))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 5))
def test_exact_split_obeys_the_law_of_total_variance(seed, histories, replies):
    rng = np.random.default_rng(seed)
    p_h, q = rng.dirichlet(np.ones(histories)), rng.dirichlet(np.ones(replies), size=histories)
    r = rng.normal(size=(histories, replies))
    split = exact_variance_split(p_h, q, r)
    prob, value = (p_h[:, None] * q).ravel(), r.ravel()  # the law of r, enumerated
    var_r = prob @ (value - prob @ value) ** 2
    assert split.total == pytest.approx(var_r, abs=1e-12)
    assert split.simulator_side + split.agent_side == pytest.approx(var_r, abs=1e-12)


@jax.jit
def _lemma_3_3(logits: toy.Tables, game: toy.Game) -> tuple[variance_split.Split, jax.Array]:
    """Lemma 3.3's Doob terms per context and turn, and the trajectory probabilities given the context."""
    return variance_split.split(logits, game), toy.turn_probs(toy.policy(logits), game.sim, jnp.ones(1))[1]


@pytest.mark.parametrize("fork_turn", [1, 2])
def test_exact_split_at_a_simulator_turn_regroups_the_lemma_3_3_terms(fork_turn):
    """Two-turn dialogue, one context, history h = (a_1, u_1, ..., a_t) at simulator turn t. With the whole
    continuation (u_t onwards) as the 'reply', the simulator side collects the Doob terms from simulator
    turn t on and the agent side those before it. With the reply u_t alone and r = E[R | h, u_t], the
    simulator side is the lemma's simulator term of turn t. Reference: theory.variance_split."""
    rng = np.random.default_rng(fork_turn)
    shape = toy.Shape(contexts=1, actions=3, replies=2, horizon=2)
    with jax.enable_x64(True):
        games = toy.random_games(rng, shape, np.array([1.0]))
        logits = tuple(t[0] for t in toy.random_logits(rng, shape, np.array([1.0])))
        game = toy.Game(games.rho[0], tuple(s[0] for s in games.sim), games.reward[0])
        lemma, p_traj = _lemma_3_3(logits, game)
    doob = np.stack([lemma.agent[0], lemma.simulator[0]], axis=-1).ravel()  # agent_1, sim_1, agent_2, sim_2
    cut = 2 * fork_turn - 1  # number of history axes, and of Doob terms before simulator turn t
    histories = int(np.prod(p_traj.shape[1 : 1 + cut]))
    joint = np.asarray(p_traj[0]).reshape(histories, shape.replies, -1)  # P(h, u_t, rest)
    reward = np.asarray(game.reward[0]).reshape(joint.shape)
    p_h, p_hu = joint.sum(axis=(1, 2)), joint.sum(axis=2)

    continuation = exact_variance_split(p_h, joint.reshape(histories, -1) / p_h[:, None],
                                        reward.reshape(histories, -1))
    np.testing.assert_allclose(terms(continuation), [doob[cut:].sum(), doob[:cut].sum(), lemma.total[0]],
                               atol=1e-12)
    one_reply = exact_variance_split(p_h, p_hu / p_h[:, None], (joint * reward).sum(axis=2) / p_hu)
    np.testing.assert_allclose(terms(one_reply), [doob[cut], doob[:cut].sum(), doob[: cut + 1].sum()],
                               atol=1e-12)


# --------------------------------------------------------------------------------- branching estimator

# Toy where the split is known exactly: 3 histories, each with its own law over returns {0, 1/2, 1}.
P_H = np.array([0.5, 0.3, 0.2])
Q = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
R = np.tile([0.0, 0.5, 1.0], (3, 1))


def draw_forks(rng: np.random.Generator, batches: int, forks: int, branches: int) -> np.ndarray:
    """[batches, forks, branches] returns: h ~ P_H per fork, then the reply ~ Q[h] per branch."""
    h = rng.choice(len(P_H), size=(batches, forks), p=P_H)
    u = (rng.random((batches, forks, branches, 1)) > Q[h].cumsum(-1)[:, :, None, :]).sum(-1)
    return R[h[..., None], u]


def estimates(returns: np.ndarray) -> np.ndarray:
    """[batches, 3]: the branching estimates of (simulator_side, agent_side, total), per batch."""
    return np.array([terms(branching_variance_split(batch)) for batch in returns])


def test_branching_estimate_matches_the_exact_split():
    exact = terms(exact_variance_split(P_H, Q, R))
    rng = np.random.default_rng(0)
    estimate = estimates(draw_forks(rng, 1, forks=4000, branches=4))[0]
    # standard error of one estimate, from 100 independent batches of the same size
    se = estimates(draw_forks(rng, 100, forks=4000, branches=4)).std(axis=0, ddof=1)
    assert np.all(5 * se < 0.2 * exact)  # the tolerance is tight enough to mean something
    assert np.all(np.abs(estimate - exact) < 5 * se), (estimate, exact, se)


def test_branching_estimate_is_unbiased_and_the_naive_one_is_not():
    """2000 repetitions of F = 20 forks, k = 2 branches: the mean estimate is within 4.5 standard errors of
    the exact split. The naive plug-in (population variances, no 1/k correction) misses by far more."""
    exact = terms(exact_variance_split(P_H, Q, R))
    returns = draw_forks(np.random.default_rng(1), 2000, forks=20, branches=2)
    naive = np.stack([returns.var(axis=2).mean(axis=1), returns.mean(axis=2).var(axis=1)], axis=1)
    for values, target, within in ((estimates(returns), exact, True), (naive, exact[:2], False)):
        se = values.std(axis=0, ddof=1) / np.sqrt(len(values))
        assert np.all(np.abs(values.mean(axis=0) - target) < 4.5 * se) == within
        if not within:
            assert np.all(np.abs(values.mean(axis=0) - target) > 20 * se)


def test_branching_rejects_too_few_forks_or_branches():
    for shape in [(1, 4), (4, 1), (8,)]:
        with pytest.raises(ValueError):
            branching_variance_split(np.zeros(shape))


def test_branching_constant_returns_give_zero_and_nan_share():
    split = branching_variance_split(np.full((3, 3), 0.1))
    assert terms(split).tolist() == [0.0, 0.0, 0.0] and math.isnan(split.simulator_share)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(2, 6), st.integers(2, 5)),
                  elements=st.floats(-100, 100, allow_nan=False, allow_infinity=False)),
       st.floats(-1e3, 1e3))
def test_branching_algebra(returns, shift):
    """simulator_side >= 0 and total >= 0; total = simulator_side + agent_side; simulator_side and total are
    half the mean squared difference over same-fork and cross-fork pairs (brute force), and total equals
    SS_tot / (k (F - 1)) - SS_within / (k F (F - 1)); shifting every return changes nothing."""
    forks, k = returns.shape
    split = branching_variance_split(returns)
    scale = 1e-9 * (1.0 + np.ptp(returns) ** 2)
    assert split.simulator_side >= 0 and split.total >= 0
    assert split.total == pytest.approx(split.simulator_side + split.agent_side, abs=scale)

    flat, fork = returns.ravel(), np.repeat(np.arange(forks), k)
    half_sq = (flat[:, None] - flat[None, :]) ** 2 / 2
    same_fork, itself = fork[:, None] == fork[None, :], np.eye(flat.size, dtype=bool)
    assert split.simulator_side == pytest.approx(half_sq[same_fork & ~itself].mean(), abs=scale)
    assert split.total == pytest.approx(half_sq[~same_fork].mean(), abs=scale)
    ss_tot = ((flat - flat.mean()) ** 2).sum()
    ss_within = ((returns - returns.mean(axis=1, keepdims=True)) ** 2).sum()
    assert split.total == pytest.approx(ss_tot / (k * (forks - 1)) - ss_within / (k * forks * (forks - 1)),
                                        abs=scale)

    shifted = branching_variance_split(returns + shift)
    np.testing.assert_allclose(terms(shifted), terms(split), atol=1e-9 * (1.0 + (np.ptp(returns) + 1) ** 2))
    assert math.isnan(split.simulator_share) == (split.total == 0)
    if np.ptp(returns) == 0:
        assert split.total == 0
