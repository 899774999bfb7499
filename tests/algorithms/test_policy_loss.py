import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope_jax.algorithms import clipped_policy_loss

# Ratios 0.5, 0.9, 1.0, 1.25, 1.5, 4.0 against logp_old = 0; row 0 has advantage +1, row 1 advantage -2.
RATIOS = [0.5, 0.9, 1.0, 1.25, 1.5, 4.0]
LOGP_NEW = jnp.log(jnp.array([RATIOS, RATIOS]))
LOGP_OLD = jnp.zeros((2, len(RATIOS)))
ADVANTAGES = jnp.array([1.0, -2.0])


@functools.cache
def loss_fn(**kwargs):
    """clipped_policy_loss with these settings, jitted once per settings."""
    return jax.jit(lambda new, old, adv: clipped_policy_loss(new, old, adv, **kwargs))


@functools.cache
def grad_fn(**kwargs):
    """Gradient of the summed per-token loss w.r.t. logp_new, jitted once per settings."""
    return jax.jit(jax.grad(lambda new, old, adv: jnp.sum(clipped_policy_loss(new, old, adv, **kwargs)[0])))


def test_symmetric_clip_by_hand():
    loss, clipped = loss_fn(epsilon_low=0.2, epsilon_high=0.2)(LOGP_NEW, LOGP_OLD, ADVANTAGES)
    # A = +1: loss = -min(rho, clip(rho, 0.8, 1.2)); only rho > 1.2 is clipped.
    # A = -2: loss = 2 * max(rho, clip(rho, 0.8, 1.2)); only rho < 0.8 is clipped.
    expected_loss = [[-0.5, -0.9, -1.0, -1.2, -1.2, -1.2],
                     [2 * 0.8, 2 * 0.9, 2.0, 2 * 1.25, 2 * 1.5, 2 * 4.0]]
    expected_clipped = [[0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0, 0]]
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    np.testing.assert_array_equal(clipped, expected_clipped)
    assert loss.dtype == clipped.dtype == jnp.float32


def test_clip_higher_and_dual_clip_by_hand():
    loss, clipped = loss_fn(epsilon_low=0.2, epsilon_high=0.28, dual_clip=3.0)(LOGP_NEW, LOGP_OLD, ADVANTAGES)
    # A = +1: the upper bound is now 1.28, so rho = 1.25 passes unclipped.
    # A = -2: rho = 4 would cost 2 * 4 = 8; the dual clip caps it at 3 * |A| = 6.
    expected_loss = [[-0.5, -0.9, -1.0, -1.25, -1.28, -1.28],
                     [2 * 0.8, 2 * 0.9, 2.0, 2 * 1.25, 2 * 1.5, 3.0 * 2]]
    expected_clipped = [[0, 0, 0, 0, 1, 1], [1, 0, 0, 0, 0, 1]]
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    np.testing.assert_array_equal(clipped, expected_clipped)


def test_per_token_advantages_match_broadcast_sequence_advantages():
    per_token = jnp.broadcast_to(ADVANTAGES[:, None], LOGP_NEW.shape)
    fn = loss_fn(epsilon_high=0.3, dual_clip=2.0)
    for a, b in zip(fn(LOGP_NEW, LOGP_OLD, ADVANTAGES), fn(LOGP_NEW, LOGP_OLD, per_token)):
        np.testing.assert_array_equal(a, b)
    # a per-token advantage that differs inside a row changes only that token
    varied = per_token.at[0, 0].set(-1.0)
    loss, _ = fn(LOGP_NEW, LOGP_OLD, varied)
    np.testing.assert_allclose(loss[0, 0], 1.0 * max(0.5, 0.8), rtol=1e-6)


B, L = 3, 5
log_ratio_st = hnp.arrays(np.float32, (B, L), elements=st.floats(-2.0, 2.0, width=32))
logp_st = hnp.arrays(np.float32, (B, L), elements=st.floats(-5.0, 0.0, width=32))
token_adv_st = hnp.arrays(np.float32, (B, L), elements=st.floats(-3.0, 3.0, width=32))


@settings(max_examples=50, deadline=None)
@given(log_ratio=log_ratio_st, logp_old=logp_st, advantages=token_adv_st,
       dual_clip=st.sampled_from([None, 1.5]))
def test_gradient_is_zero_exactly_where_clipped(log_ratio, logp_old, advantages, dual_clip):
    settings_ = dict(epsilon_low=0.2, epsilon_high=0.28, dual_clip=dual_clip)
    logp_new = logp_old + log_ratio
    _, clipped = loss_fn(**settings_)(logp_new, logp_old, advantages)
    grad = np.asarray(grad_fn(**settings_)(logp_new, logp_old, advantages))
    clipped = np.asarray(clipped).astype(bool)
    np.testing.assert_array_equal(grad[clipped], 0.0)
    # unclipped tokens follow d(-A * rho)/d logp_new = -A * rho
    ratio = np.exp(np.asarray(logp_new, np.float64) - logp_old)
    np.testing.assert_allclose(grad[~clipped], (-advantages * ratio)[~clipped], rtol=1e-4, atol=1e-6)


def test_no_gradient_reaches_logp_old():
    fn = loss_fn()
    grad = jax.grad(lambda old: jnp.sum(fn(LOGP_NEW, old, ADVANTAGES)[0]))(LOGP_OLD)
    np.testing.assert_array_equal(grad, 0.0)


@settings(max_examples=50, deadline=None)
@given(log_ratio=hnp.arrays(np.float32, (B, L), elements=st.floats(-10.0, 10.0, width=32)),
       advantages=token_adv_st)
def test_dual_clip_bounds_the_loss_of_negative_advantages(log_ratio, advantages):
    c = 3.0
    loss, _ = loss_fn(dual_clip=c)(jnp.asarray(log_ratio), jnp.zeros((B, L)), advantages)
    negative = advantages < 0
    assert np.all(np.asarray(loss)[negative] <= c * np.abs(advantages[negative]) * (1 + 1e-6))


def test_bad_arguments():
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(LOGP_NEW, LOGP_OLD, ADVANTAGES, dual_clip=1.0)
    with pytest.raises(AssertionError):
        clipped_policy_loss(LOGP_NEW, LOGP_OLD[:, :3], ADVANTAGES)
    with pytest.raises(AssertionError):
        clipped_policy_loss(LOGP_NEW, LOGP_OLD, jnp.zeros(3))
    with pytest.raises(AssertionError):
        clipped_policy_loss(LOGP_NEW[0], LOGP_OLD[0], ADVANTAGES)
