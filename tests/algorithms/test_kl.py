import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope_jax.algorithms import KL_ESTIMATORS

JITTED = {name: jax.jit(fn) for name, fn in KL_ESTIMATORS.items()}

# log-ratios d = logp - logp_ref of 0, 1, -1, 2 (logp_ref = -1 everywhere)
LOGP_REF = jnp.full((1, 4), -1.0)
LOGP = LOGP_REF + jnp.array([[0.0, 1.0, -1.0, 2.0]])


def test_estimators_by_hand():
    np.testing.assert_allclose(JITTED["k1"](LOGP, LOGP_REF), [[0.0, 1.0, -1.0, 2.0]], atol=1e-7)
    np.testing.assert_allclose(JITTED["k2"](LOGP, LOGP_REF), [[0.0, 0.5, 0.5, 2.0]], atol=1e-7)
    # k3 = exp(-d) + d - 1
    expected_k3 = [[0.0, math.exp(-1.0), math.exp(1.0) - 2.0, math.exp(-2.0) + 1.0]]
    np.testing.assert_allclose(JITTED["k3"](LOGP, LOGP_REF), expected_k3, rtol=1e-6, atol=1e-7)


def test_k3_is_accurate_for_small_log_ratios():
    d = np.array([[1e-3, -1e-3, 3e-4, -2e-2]], np.float32)
    # float64 arithmetic on the float32 log-ratios; the value is about d^2 / 2
    expected = np.exp(-d.astype(np.float64)) + d.astype(np.float64) - 1.0
    np.testing.assert_allclose(JITTED["k3"](d, np.zeros_like(d)), expected, rtol=1e-3)


B, L = 4, 6
logp_st = hnp.arrays(np.float32, (B, L), elements=st.floats(-12.0, 0.0, width=32))


@pytest.mark.parametrize("name", ["k2", "k3"])
@settings(max_examples=50, deadline=None)
@given(logp=logp_st, logp_ref=logp_st)
def test_k2_k3_are_nonnegative_and_zero_at_equality(name, logp, logp_ref):
    values = np.asarray(JITTED[name](logp, logp_ref))
    assert np.all(np.isfinite(values))
    assert np.all(values >= 0.0)
    np.testing.assert_array_equal(JITTED[name](logp, logp), 0.0)


def test_k1_is_zero_at_equality():
    np.testing.assert_array_equal(JITTED["k1"](LOGP, LOGP), 0.0)


V = 6
logits_st = hnp.arrays(np.float64, V, elements=st.floats(-4.0, 4.0))


@pytest.mark.parametrize("name", ["k1", "k3"])
@settings(max_examples=50, deadline=None)
@given(logits_p=logits_st, logits_q=logits_st)
def test_unbiased_for_kl_policy_to_reference_by_exact_enumeration(name, logits_p, logits_q):
    """E_{x~p}[k(log p(x), log q(x))] over all V outcomes equals KL(p || q) = sum_x p log(p / q)."""
    p = np.exp(logits_p) / np.exp(logits_p).sum()
    q = np.exp(logits_q) / np.exp(logits_q).sum()
    exact_kl = float(np.sum(p * (np.log(p) - np.log(q))))
    logp, logq = np.log(p)[None].astype(np.float32), np.log(q)[None].astype(np.float32)
    expectation = np.sum(p * np.asarray(JITTED[name](logp, logq))[0])
    np.testing.assert_allclose(expectation, exact_kl, rtol=1e-4, atol=1e-5)


def test_k2_is_biased():
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    exact_kl = float(np.sum(p * np.log(p / q)))
    k2 = np.asarray(JITTED["k2"](np.log(p)[None], np.log(q)[None]))[0]
    assert abs(np.sum(p * k2) - exact_kl) > 0.1


def test_unknown_estimator_and_bad_shapes_are_refused():
    with pytest.raises(KeyError, match="k4"):
        KL_ESTIMATORS["k4"]
    with pytest.raises(AssertionError):
        JITTED["k1"](LOGP, LOGP_REF[:, :3])
