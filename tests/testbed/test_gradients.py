"""The exact value in jnp and the Theorem 3.2 gradient panel."""

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.models.tiny import tiny_config
from scope_jax.testbed import gradients

CONFIG = tiny_config(lm.VOCAB_SIZE, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)


def _random_policy(seed: int) -> np.ndarray:
    p = np.exp(np.random.default_rng(seed).normal(size=(personas.N_STATES, personas.N_AGENT)))
    return p / p.sum(-1, keepdims=True)


def test_jnp_value_matches_the_numpy_enumeration():
    for policy, sim in ((_random_policy(0), personas.base_simulator()),
                        (personas.p4g_policy(), personas.collapsed_simulator())):
        value = gradients.policy_value(jnp.asarray(policy, jnp.float32), jnp.asarray(sim, jnp.float32))
        assert abs(float(value) - personas.policy_value(policy, sim)) < 1e-5


def test_value_gradient_matches_finite_differences():
    policy, sim = _random_policy(1), personas.base_simulator()
    grad = np.asarray(jax.grad(gradients.policy_value)(jnp.asarray(policy), jnp.asarray(sim)))
    rng = np.random.default_rng(2)
    for _ in range(3):  # a direction that keeps the rows summing to 1
        direction = rng.normal(size=policy.shape)
        direction -= direction.mean(-1, keepdims=True)
        h = 1e-4 / np.abs(direction).max()
        numeric = (personas.policy_value(policy + h * direction, sim)
                   - personas.policy_value(policy - h * direction, sim)) / (2 * h)
        assert abs(numeric - np.sum(grad * direction)) < 1e-4 * max(1.0, abs(numeric))


def test_panel_of_a_deterministic_simulator_is_its_own_mode_user():
    graphdef, params = decoder.init(CONFIG, seed=0)
    panel = gradients.GradientPanel(graphdef)
    population = personas.base_simulator()
    deterministic = np.eye(personas.N_USER)[np.argmax(population, -1)]
    same = panel(params, deterministic[None], deterministic)
    assert abs(same["grad_cos_mode"] - 1) < 1e-5 and same["grad_dist_mode"] < 1e-6 * same["grad_norm"] + 1e-9
    assert abs(same["grad_cos_population"] - 1) < 1e-5
    spread = panel(params, population[None], population)
    assert abs(spread["grad_cos_population"] - 1) < 1e-5
    assert spread["grad_cos_mode"] < 0.999 and spread["grad_dist_mode"] > 0
