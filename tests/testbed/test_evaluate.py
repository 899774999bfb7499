"""Exact metrics of a tabulated agent: success, the Lemma 3.3 variance split, entropies."""

import numpy as np

from scope_jax.envs import personas
from scope_jax.testbed import evaluate

POPULATION = personas.base_simulator()


def _random_policy(seed: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(size=(personas.N_STATES, personas.N_AGENT))
    policy = np.exp(logits)
    return policy / policy.sum(-1, keepdims=True)


def test_success_and_variance_split_match_the_enumerated_episodes():
    for policy, sim in ((personas.p4g_policy(), POPULATION),
                        (_random_policy(0), personas.collapsed_simulator())):
        ep = personas.episodes(policy, sim)
        assert np.isclose(evaluate.success_probability(policy, sim), ep.probs[ep.rewards >= 0.5].sum())
        split = evaluate.variance_split(policy, sim)
        mean = ep.probs @ ep.rewards
        assert np.isclose(split.total, ep.probs @ (ep.rewards - mean) ** 2)
        assert split.simulator_side > 0 and split.agent_side > 0
        assert np.isclose(split.simulator_side + split.agent_side, split.total)


def test_a_deterministic_simulator_has_no_simulator_side_variance():
    sim = np.zeros_like(POPULATION)
    sim[..., personas.NEUTRAL] = 1.0
    split = evaluate.variance_split(_random_policy(1), sim)
    assert split.simulator_side == 0.0 and split.simulator_share == 0.0


def test_exact_metrics_of_the_p4g_agent():
    collapsed = personas.collapsed_simulator()
    metrics = evaluate.exact_metrics(personas.p4g_policy(), [collapsed], POPULATION, [POPULATION],
                                     [collapsed])
    assert np.isclose(metrics["heldout_value"], 0.3183, atol=1e-4)
    assert metrics["heldout_sims_value"] == metrics["heldout_value"]
    assert np.isclose(metrics["sim_deviation"], 0.4025, atol=1e-4)
    assert metrics["sim_kl_to_start"] == 0.0
    # the P4G agent plays the same distribution everywhere: every weighting gives its entropy
    assert np.isclose(metrics["entropy_off_sim"], metrics["first_turn_entropy"])
    refs = evaluate.reference_values(POPULATION)
    assert np.isclose(refs["best adaptive"]["value"], 0.6503, atol=1e-4)
    assert np.isclose(refs["persona known"]["value"], 0.7780, atol=1e-4)
    assert refs["best adaptive"]["success"] < refs["persona known"]["success"]


def test_kl_to_start_is_the_on_policy_mean_of_the_per_context_kl():
    """Against a direct sum over the enumerated dialogues' simulator turns."""
    policy, sim, start = _random_policy(2), personas.collapsed_simulator(), POPULATION
    ep = personas.episodes(policy, sim)
    total = weight = 0.0
    for tokens, prob in zip(ep.tokens, ep.probs):
        history = []
        for a, u in zip(tokens[1::2], tokens[2::2]):
            if a == personas.PAD or u == personas.PAD or a - personas.AGENT_TOKEN0 == personas.ASK:
                break
            s, i = a - personas.AGENT_TOKEN0, personas.state_index(history)
            q, q0 = sim[i, s], start[i, s]
            total += prob * np.sum(q * np.log(q / q0))
            weight += prob
            history.append((s, u - personas.USER_TOKEN0))
    assert np.isclose(evaluate.kl_to_start(policy, sim, start), total / weight)
