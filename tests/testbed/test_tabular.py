"""Co-training in the tabular game: the exact value, its gradients, the best response, the regret
objective's gradient and frozen simulators, each against the numpy enumeration of `personas`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.envs import personas
from scope_jax.testbed import tabular

COLLAPSED = tabular.sim_logits(personas.collapsed_simulator())


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logits(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _numpy_value(agent_logits: np.ndarray, sim_logits: np.ndarray) -> float:
    return personas.policy_value(_softmax(agent_logits.astype(np.float64)),
                                 _softmax(sim_logits.astype(np.float64)))


def _directional_fd(f, x: np.ndarray, direction: np.ndarray, h: float = 1e-4) -> float:
    x = x.astype(np.float64)
    return (f(x + h * direction) - f(x - h * direction)) / (2 * h)


@pytest.fixture(scope="module")
def compiled():
    return {"value": jax.jit(tabular.value), "grad_agent": jax.jit(jax.grad(tabular.value)),
            "grad_sim_gain": jax.jit(jax.grad(tabular.sim_gain)),
            "best_response": jax.jit(tabular.best_response),
            "train": jax.jit(tabular.train, static_argnums=(2, 3))}


def test_value_equals_the_numpy_enumeration(compiled):
    cases = [(_logits(0, tabular.AGENT_SHAPE), _logits(1, tabular.SIM_SHAPE)),
             (tabular.initial_agent(0, 0.0), COLLAPSED),  # the untrained agent: asks early with p ~ 1e-3
             (_logits(2, tabular.AGENT_SHAPE), tabular.sim_logits(personas.base_simulator()))]
    for agent, sim in cases:
        assert float(compiled["value"](agent, sim)) == pytest.approx(_numpy_value(agent, sim), abs=2e-6)
    # the untrained agent's logits floor the early ask at ASK_FLOOR and keep the P4G strategy frequencies
    policy = _softmax(tabular.initial_agent(0, 0.0).astype(np.float64))
    p4g = personas.p4g_policy()
    np.testing.assert_allclose(policy[:, personas.ASK], tabular.ASK_FLOOR / (1 + tabular.ASK_FLOOR),
                               rtol=1e-5)
    np.testing.assert_allclose(policy[:, :personas.N_STRATEGIES], p4g[:, :personas.N_STRATEGIES]
                               / (1 + tabular.ASK_FLOOR), rtol=1e-5)


def test_turn_weights_are_the_on_policy_reach():
    agent, sim = _softmax(_logits(3, tabular.AGENT_SHAPE)), _softmax(_logits(4, tabular.SIM_SHAPE))
    w = personas.reach_probabilities(agent, sim)[:, None] * agent[:, :personas.N_STRATEGIES]
    np.testing.assert_allclose(np.asarray(tabular.turn_weights(jnp.asarray(agent), jnp.asarray(sim))),
                               w / w.sum(), rtol=1e-4, atol=1e-9)


def test_exact_gradients_match_finite_differences_of_the_numpy_value(compiled):
    agent, sim = _logits(5, tabular.AGENT_SHAPE), _logits(6, tabular.SIM_SHAPE)
    adversarial = tabular.setting(tabular.OBJECTIVES["adversarial"], 0.0, 0.1, COLLAPSED)
    g_agent = np.asarray(compiled["grad_agent"](agent, sim), np.float64)
    g_sim = np.asarray(compiled["grad_sim_gain"](sim, jax.nn.softmax(agent), adversarial), np.float64)
    rng = np.random.default_rng(7)
    for _ in range(2):
        d_agent, d_sim = rng.normal(size=agent.shape), rng.normal(size=sim.shape)
        numeric_agent = _directional_fd(lambda a: _numpy_value(a, sim), agent, d_agent)
        numeric_sim = _directional_fd(lambda q: -_numpy_value(agent, q), sim, d_sim)
        assert np.sum(g_agent * d_agent) == pytest.approx(numeric_agent, rel=1e-3, abs=1e-6)
        assert np.sum(g_sim * d_sim) == pytest.approx(numeric_sim, rel=1e-3, abs=1e-6)


def test_best_response_is_the_numpy_backward_induction(compiled):
    for sim in (_softmax(_logits(8, tabular.SIM_SHAPE)), personas.base_simulator(),
                personas.collapsed_simulator()):
        pi_star = np.asarray(compiled["best_response"](jnp.asarray(sim, jnp.float32)))
        np.testing.assert_array_equal(pi_star, personas.best_response(sim).policy)


def test_regret_gradient_is_that_of_max_value_minus_the_agents(compiled):
    """Envelope theorem: with pi* held fixed, the gradient is d/dq [max_pi V(pi, q) - V(agent, q)]."""
    agent, sim = _logits(9, tabular.AGENT_SHAPE), _logits(10, tabular.SIM_SHAPE)
    regret = tabular.setting(tabular.OBJECTIVES["regret"], 0.0, 0.1, COLLAPSED)
    g_sim = np.asarray(compiled["grad_sim_gain"](sim, jax.nn.softmax(agent), regret), np.float64)
    policy = _softmax(agent.astype(np.float64))
    true_regret = lambda q: (personas.best_response(_softmax(q)).value
                             - personas.policy_value(policy, _softmax(q)))
    d_sim = np.random.default_rng(11).normal(size=sim.shape)
    numeric = _directional_fd(true_regret, sim, d_sim)
    assert np.sum(g_sim * d_sim) == pytest.approx(numeric, rel=1e-3, abs=1e-6)


def test_frozen_simulators_stay_bit_for_bit_while_the_agent_trains(compiled):
    agent = jnp.asarray(tabular.initial_agent(0, 0.1))
    for start in (COLLAPSED, tabular.sim_logits(personas.base_simulator())):
        frozen = tabular.members(tabular.setting(tabular.OBJECTIVES["adversarial"], 1.0, 0.0, start))
        state, log = compiled["train"](tabular.init(agent, frozen), frozen, 0.1, 5)
        np.testing.assert_array_equal(np.asarray(state.sim[0]), start)
        assert float(log.train_value[-1]) > float(log.train_value[0]) + 1e-3  # the agent did train
