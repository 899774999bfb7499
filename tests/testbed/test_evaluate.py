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
    metrics = evaluate.exact_metrics(personas.p4g_policy(), [personas.collapsed_simulator()], POPULATION,
                                     [POPULATION])
    assert np.isclose(metrics["heldout_value"], 0.3183, atol=1e-4)
    assert metrics["heldout_sims_value"] == metrics["heldout_value"]
    assert np.isclose(metrics["sim_deviation"], 0.4025, atol=1e-4)
    # the P4G agent plays the same distribution everywhere: every weighting gives its entropy
    assert np.isclose(metrics["entropy_off_sim"], metrics["first_turn_entropy"])
    refs = evaluate.reference_values(POPULATION)
    assert np.isclose(refs["best adaptive"]["value"], 0.6503, atol=1e-4)
    assert np.isclose(refs["persona known"]["value"], 0.7780, atol=1e-4)
    assert refs["best adaptive"]["success"] < refs["persona known"]["success"]
