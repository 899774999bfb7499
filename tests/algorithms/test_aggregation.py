import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.algorithms import AGGREGATIONS

JITTED = {name: jax.jit(fn) for name, fn in AGGREGATIONS.items()}

LOSS = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0], [9.0, 9.0, 9.0, 9.0]])
MASK = jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
EXPECTED = {
    # (1 + 2 + 3 + 4 + 5 + 6) / 6 tokens
    "token_mean": 21.0 / 6.0,
    # mean of the non-empty rows' token means: (10 / 4 + 11 / 2) / 2
    "seq_mean_token_mean": (2.5 + 5.5) / 2.0,
    # token sums over the constant L = 4, averaged over all 3 rows: (10 / 4 + 11 / 4 + 0) / 3
    "seq_mean_token_sum_norm": (10.0 / 4.0 + 11.0 / 4.0 + 0.0) / 3.0,
}


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_aggregation_by_hand(name):
    value = JITTED[name](LOSS, MASK)
    assert value.shape == () and value.dtype == jnp.float32
    np.testing.assert_allclose(value, EXPECTED[name], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_masked_tokens_do_not_count(name):
    changed = jnp.where(MASK > 0, LOSS, -1e6)
    np.testing.assert_allclose(JITTED[name](changed, MASK), EXPECTED[name], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_empty_mask_gives_zero_and_finite_gradients(name):
    empty = jnp.zeros_like(MASK)
    assert JITTED[name](LOSS, empty) == 0.0
    grad = jax.grad(JITTED[name])(LOSS, empty)
    np.testing.assert_array_equal(grad, 0.0)


def test_gradients_weigh_tokens_as_documented():
    grads = {name: np.asarray(jax.grad(fn)(LOSS, MASK)) for name, fn in JITTED.items()}
    np.testing.assert_allclose(grads["token_mean"], np.asarray(MASK) / 6.0)
    np.testing.assert_allclose(grads["seq_mean_token_mean"],
                               [[1 / 8] * 4, [1 / 4, 1 / 4, 0, 0], [0] * 4])
    np.testing.assert_allclose(grads["seq_mean_token_sum_norm"], np.asarray(MASK) / (4 * 3))


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_shape_checks(name):
    with pytest.raises(AssertionError):
        AGGREGATIONS[name](LOSS, MASK[:, :3])
    with pytest.raises(AssertionError):
        AGGREGATIONS[name](LOSS[0], MASK[0])
