import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope_jax.algorithms import entropy_bonus, token_entropy

entropy_jit = jax.jit(token_entropy)


def test_entropy_by_hand():
    logits = jnp.array([[
        [0.0, 0.0, 0.0, 0.0],  # uniform over 4: log 4
        [0.0, 0.0, math.log(2.0), -1e9],  # p = 1/4, 1/4, 1/2, 0: 2 * (1/4) log 4 + (1/2) log 2 = 1.5 log 2
        [7.0, 7.0, 7.0, 7.0],  # shifting the logits changes nothing
    ]])
    np.testing.assert_allclose(entropy_jit(logits), [[math.log(4.0), 1.5 * math.log(2.0), math.log(4.0)]],
                               rtol=1e-6)


def test_entropy_is_stable_for_large_logits_and_float32_for_bfloat16():
    logits = jnp.array([[[1e4, 0.0, 0.0], [3e4, 3e4, -3e4]]])
    np.testing.assert_allclose(entropy_jit(logits), [[0.0, math.log(2.0)]], atol=1e-6)
    half = entropy_jit(jnp.zeros((1, 2, 8), jnp.bfloat16))
    assert half.dtype == jnp.float32
    np.testing.assert_allclose(half, math.log(8.0), rtol=1e-6)


V = 16


@settings(max_examples=50, deadline=None)
@given(logits=hnp.arrays(np.float32, (2, 3, V), elements=st.floats(-30.0, 30.0, width=32)))
def test_entropy_lies_between_zero_and_log_vocab(logits):
    entropy = np.asarray(entropy_jit(logits))
    assert np.all(entropy >= 0.0)
    assert np.all(entropy <= math.log(V) * (1 + 1e-6))


def test_entropy_bonus_is_minus_coef_times_entropy():
    entropy = jnp.array([[0.0, 1.0, 2.5]])
    np.testing.assert_allclose(jax.jit(entropy_bonus)(entropy, 0.01), [[0.0, -0.01, -0.025]], rtol=1e-6)


def test_rank_checks():
    with pytest.raises(AssertionError):
        token_entropy(jnp.zeros((2, 3)))
    with pytest.raises(AssertionError):
        entropy_bonus(jnp.zeros((2, 3, 4)), 0.1)
