"""The persona game: exact values against plain recursive enumeration, simulators, state indexing."""

import functools

import numpy as np
import pytest

from scope_jax.envs import personas as P

P4G_POLICY = P.p4g_policy()
BASE = P.base_simulator()
COLLAPSED = P.collapsed_simulator()


@functools.cache
def replies(history, act):
    """[P, U]: every persona's reply distribution, straight from the per-history definition."""
    return np.array([P.reply_distribution(p, history, act) for p in range(len(P.PERSONAS))])


@functools.cache
def final_reward(history):
    return float(P.reward(P.score(history)))


def brute_value(history, joint, choose):
    """sum_p joint_p E_p[reward | history, then `choose`], by recursion over every trajectory.

    joint[p] = prior_p P_p(replies so far | acts so far): unnormalised, so no posterior is ever formed.
    `choose(history, q)` turns the action values q[a] (each already weighted by joint) into one value.
    """
    if len(history) == P.TURNS:
        return joint.sum() * final_reward(history)
    q = np.full(P.N_AGENT, -np.inf)
    q[P.ASK] = joint.sum() * final_reward(history)
    for a in choose.acts(history):
        probs = replies(history, a)
        q[a] = sum(
            brute_value(history + ((a, u),), joint * probs[:, u], choose)
            for u in range(P.N_USER)
            if (joint * probs[:, u]).any()
        )
    return choose(history, q)


class Optimal:
    """Pick the best act: max_a q[a] (max is positively homogeneous, so unnormalised joints are fine)."""

    @staticmethod
    def acts(history):
        return range(P.N_STRATEGIES)

    def __call__(self, history, q):
        return q.max()


class OpenLoop:
    """Play a fixed sequence whatever the replies."""

    def __init__(self, sequence):
        self.sequence = sequence

    def acts(self, history):
        a = self.sequence[len(history)]
        return [] if a == P.ASK else [a]

    def __call__(self, history, q):
        return q[self.sequence[len(history)]]


@functools.cache
def brute_fixed_values():
    """[n_sequences, P] by recursion, one persona at a time."""
    sequences = P.fixed_sequence_values().sequences
    onehots = np.eye(len(P.PERSONAS))
    return sequences, np.array([[brute_value((), e, OpenLoop(seq)) for e in onehots] for seq in sequences])


def random_policy(seed):
    return np.random.default_rng(seed).dirichlet(np.full(P.N_AGENT, 0.5), size=P.N_STATES)


def test_decision_states_are_2551_and_indexed_both_ways():
    assert P.N_STATES == 1 + 50 + 2500 == 2551
    for i in range(P.N_STATES):
        history = P.state_history(i)
        assert P.state_index(history) == i
        tokens = P.STATE_TOKENS[i, : P.STATE_LENGTH[i]]
        assert tuple(tokens) == P.history_tokens(history)
        assert (P.STATE_TOKENS[i, P.STATE_LENGTH[i] :] == P.PAD).all()
    assert P.TOKENS[P.GREETING] == "greeting"
    assert [P.TOKENS[P.AGENT_TOKEN0 + a] for a in range(P.N_AGENT)] == list(P.AGENT_ACTS)
    assert [P.TOKENS[P.USER_TOKEN0 + u] for u in range(P.N_USER)] == list(P.USER_ACTS)
    with pytest.raises(ValueError):
        P.state_index([(0, 0)] * P.TURNS)


def test_persona_tables_are_tilted_p4g_rates_and_the_inquiry_reveals_the_persona():
    tables = P.TABLES
    np.testing.assert_allclose(tables.sum(-1), 1.0)
    counts = np.asarray(P.p4g_stats.load_stats()["reply_counts"], dtype=float)
    untilted = P.persona_tables(tilts=P.Tilts(0.0, 0.0, 0.0, 0.0, 0.0))
    others = [s for s in range(P.N_STRATEGIES) if s != P.PERSONAL_INQUIRY]
    base = counts / counts.sum(-1, keepdims=True)
    np.testing.assert_allclose(untilted[:, :, others], np.broadcast_to(base, untilted.shape)[:, :, others])
    first = tables[:, ~P.INQUIRED, P.PERSONAL_INQUIRY]  # [P, 2, U]
    support = first[:, 0] > 0
    assert (support.sum(0) <= 1).all(), "reveal supports overlap"
    np.testing.assert_array_equal(first[:, 0], first[:, 1])
    assert (tables[:, P.INQUIRED, P.PERSONAL_INQUIRY] > 0).all()  # a repeated inquiry is an ordinary strategy


def test_tabulate_matches_the_vectorised_persona_tables():
    for p in range(len(P.PERSONAS)):
        table = P.tabulate(lambda h, a: P.reply_distribution(p, h, a))
        np.testing.assert_array_equal(table, P.persona_simulator(p))


@pytest.mark.parametrize("seed", [0, 1])
def test_policy_value_matches_brute_force_and_episodes(seed):
    policy = random_policy(seed)

    class Stochastic:
        @staticmethod
        def acts(history):
            return range(P.N_STRATEGIES)

        def __call__(self, history, q):
            pi = policy[P.state_index(history)]
            return float(np.sum(pi * np.where(np.isfinite(q), q, 0.0)))

    expected = brute_value((), P.PRIOR.copy(), Stochastic())
    assert P.policy_value(policy, BASE) == pytest.approx(expected, abs=1e-12)
    mixture = sum(w * P.policy_value(policy, P.persona_simulator(p)) for p, w in enumerate(P.PRIOR))
    assert P.policy_value(policy, BASE) == pytest.approx(mixture, abs=1e-12)
    eps = P.episodes(policy, COLLAPSED)
    assert eps.probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert eps.probs @ eps.rewards == pytest.approx(P.policy_value(policy, COLLAPSED), abs=1e-12)
    assert (eps.tokens[np.arange(len(eps.lengths)), eps.lengths - 1] == P.AGENT_TOKEN0 + P.ASK).all()


def test_base_simulator_generates_the_mixture_trajectory_distribution():
    policy = random_policy(2)

    def distribution(sim, weight=1.0):
        eps = P.episodes(policy, sim)
        return {tuple(t[:n]): weight * p for t, n, p in zip(eps.tokens.tolist(), eps.lengths, eps.probs)}

    base = distribution(BASE)
    mixture = {}
    for p, w in enumerate(P.PRIOR):
        for key, prob in distribution(P.persona_simulator(p), w).items():
            mixture[key] = mixture.get(key, 0.0) + prob
    mixture = {k: v for k, v in mixture.items() if v > 0}
    assert base.keys() == mixture.keys()
    np.testing.assert_allclose([base[k] for k in base], [mixture[k] for k in base], rtol=1e-10, atol=1e-15)


def test_posterior_is_bayes_rule_and_the_inquiry_identifies_the_persona():
    posterior = P.persona_posterior()
    history = ((P.CREDIBILITY, P.POSITIVE), (P.EMOTION, P.NEGATIVE))
    joint = P.PRIOR * replies((), P.CREDIBILITY)[:, P.POSITIVE]
    joint = joint * replies(history[:1], P.EMOTION)[:, P.NEGATIVE]
    np.testing.assert_allclose(posterior[P.state_index(history)], joint / joint.sum())
    revealed = {P.SHARE_PERSONAL: P.EMOTIONAL, P.ASK_INFO: P.SKEPTIC, P.POSITIVE: P.RELATIONAL,
                P.NEUTRAL: P.RELUCTANT, P.NEGATIVE: P.RELUCTANT}
    for reply, persona in revealed.items():
        state = P.state_index([(P.PERSONAL_INQUIRY, reply)])
        np.testing.assert_array_equal(posterior[state], np.eye(4)[persona])
    uniform = np.full((P.N_STATES, P.N_AGENT), 1 / P.N_AGENT)
    assert (P.reach_probabilities(uniform, BASE) > 0).all()  # every history can happen in the population


def test_fixed_sequence_values_match_brute_force():
    sequences, brute = brute_fixed_values()
    fixed = P.fixed_sequence_values()
    assert len(sequences) == 1 + 10 + 100 + 1000
    np.testing.assert_allclose(fixed.values, brute, atol=1e-12)
    seq, value = P.best_fixed_sequence()
    assert seq == (P.DONATION_INFO, P.CREDIBILITY, P.CREDIBILITY, P.ASK)
    assert value == pytest.approx((brute @ P.PRIOR).max(), abs=1e-12)
    assert value == pytest.approx(P.policy_value(P.open_loop_policy(seq), BASE), abs=1e-12)


def test_no_fixed_sequence_is_best_for_every_persona():
    _, brute = brute_fixed_values()
    best = [set(np.flatnonzero(np.isclose(brute[:, p], brute[:, p].max(), atol=1e-12))) for p in range(4)]
    assert not set.intersection(*best)


def test_adaptive_and_persona_known_optima_match_brute_force():
    adaptive = P.best_response(BASE)
    assert adaptive.value == pytest.approx(brute_value((), P.PRIOR.copy(), Optimal()), abs=1e-12)
    assert adaptive.value == pytest.approx(P.policy_value(adaptive.policy, BASE), abs=1e-12)
    assert adaptive.policy[0].argmax() == P.PERSONAL_INQUIRY
    known = sum(w * brute_value((), w0, Optimal()) for w, w0 in zip(P.PRIOR, np.eye(4)))
    assert P.persona_known_value() == pytest.approx(known, abs=1e-12)
    _, brute = brute_fixed_values()
    assert adaptive.value > (brute @ P.PRIOR).max() + 0.1
    assert P.persona_known_value() > adaptive.value


def test_best_response_beats_random_policies():
    for sim in (BASE, COLLAPSED):
        best = P.best_response(sim)
        assert all(P.policy_value(random_policy(s), sim) <= best.value for s in range(5))


def test_documented_values():
    assert P.policy_value(P4G_POLICY, BASE) == pytest.approx(0.3183, abs=5e-5)
    assert P.best_fixed_sequence()[1] == pytest.approx(0.4803, abs=5e-5)
    assert P.best_response(BASE).value == pytest.approx(0.6503, abs=5e-5)
    assert P.persona_known_value() == pytest.approx(0.7780, abs=5e-5)
    collapsed = P.best_response(COLLAPSED)
    assert collapsed.value == pytest.approx(0.8224, abs=5e-5)
    assert P.policy_value(collapsed.policy, BASE) == pytest.approx(0.2901, abs=5e-5)
    assert P.simulator_deviation(P4G_POLICY, BASE) == pytest.approx(0.5846, abs=5e-5)
    assert P.simulator_deviation(P4G_POLICY, COLLAPSED) == pytest.approx(0.4025, abs=5e-5)


def test_collapsed_simulator_is_agreeable_sharp_and_floored():
    assert COLLAPSED.min() == pytest.approx(0.05)
    np.testing.assert_allclose(COLLAPSED[..., P.NEGATIVE], 0.05)
    np.testing.assert_allclose(COLLAPSED.sum(-1), 1.0)
    for policy in (P4G_POLICY, P.best_response(BASE).policy, P.best_response(COLLAPSED).policy):
        assert P.simulator_deviation(policy, COLLAPSED) < P.simulator_deviation(policy, BASE)


def test_training_on_the_collapsed_simulator_hurts_the_population():
    collapsed = P.best_response(COLLAPSED)
    assert collapsed.policy[0].argmax() == P.PERSONAL_STORY
    assert P.policy_value(collapsed.policy, BASE) < P.policy_value(P4G_POLICY, BASE)


def test_p4g_policy_uses_the_strategy_frequencies():
    turns = np.asarray(P.p4g_stats.load_stats()["strategy_turns"], dtype=float)
    np.testing.assert_allclose(P4G_POLICY[:, : P.N_STRATEGIES], np.tile(turns / turns.sum(), (P.N_STATES, 1)))
    assert (P4G_POLICY[:, P.ASK] == 0).all()
    assert P4G_POLICY[0].argmax() == P.CREDIBILITY


def test_open_loop_policy_rejects_bad_sequences():
    with pytest.raises(ValueError):
        P.open_loop_policy((P.LOGICAL,))
    with pytest.raises(ValueError):
        P.open_loop_policy((P.LOGICAL,) * 4 + (P.ASK,))
    with pytest.raises(ValueError):
        P.policy_value(np.ones((P.N_STATES, P.N_AGENT)), BASE)
