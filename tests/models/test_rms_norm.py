"""`decoder.rms_norm`'s written-out backward pass against autodiff of a float64 reference, and what it
keeps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models.decoder import rms_norm

EPS = 1e-5


def reference(x, weight, axis):
    """float64 weight * x / sqrt(mean(x^2) + eps), differentiated by autodiff."""
    x64 = x.astype(jnp.float64)
    return weight.astype(jnp.float64) * x64 / jnp.sqrt(jnp.mean(x64 * x64, axis=axis, keepdims=True) + EPS)


@pytest.mark.parametrize("axis, x_shape, weight_shape", [(-1, (2, 5, 8), (8,)), (0, (8, 3), (8, 1))],
                         ids=["token-major", "feature-major"])
def test_rms_norm_values_and_gradients_equal_a_float64_reference(axis, x_shape, weight_shape):
    rng = np.random.default_rng(0)
    x, weight, grad = (jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)
                       for shape, scale in ((x_shape, 3.0), (weight_shape, 1.0), (x_shape, 1.0)))
    out, backward = jax.vjp(lambda x, w: rms_norm(x, w, EPS, axis), x, weight)
    with jax.enable_x64():
        expected, reference_backward = jax.vjp(lambda x, w: reference(x, w, axis), x.astype(jnp.float64),
                                               weight.astype(jnp.float64))
        expected_grads = reference_backward(grad.astype(jnp.float64))
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    for name, ours, theirs in zip(("x", "weight"), backward(grad), expected_grads):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6, err_msg=name)


def test_rms_norm_keeps_x_and_one_inverse_root_per_row():
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    _, backward = jax.vjp(lambda x, w: rms_norm(x, w, EPS, -1), x, jnp.ones((8,)))
    shapes = sorted(leaf.shape for leaf in jax.tree.leaves(backward))
    assert shapes == sorted([(2, 5, 8), (2, 5, 1), (8,)]), shapes
