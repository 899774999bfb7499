"""The XLA:CPU layout tricks are selected by backend: on an accelerator the plain forms run, with the same
values (docs/models.md, "Speed on a CPU")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.logprobs import head_weight_grad
from scope_jax.models import decoder
from tests.jaxprs import dot_generals


def _primitives(fn, *args) -> set[str]:
    # a new function per call: a traced jaxpr cached from another backend setting must not answer
    return {eqn.primitive.name for eqn in jax.make_jaxpr(lambda *a: fn(*a))(*args).jaxpr.eqns}


@pytest.mark.parametrize("backend, barrier", [("cpu", True), ("gpu", False), ("tpu", False)])
def test_weight_grad_uses_the_barrier_on_the_cpu_only_and_equals_inputs_t_grad(monkeypatch, backend, barrier):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    inputs, grad = (jax.random.normal(jax.random.key(i), (2, 5, n)) for i, n in enumerate((6, 4)))
    assert ("optimization_barrier" in _primitives(decoder.weight_grad, inputs, grad)) == barrier
    expected = np.einsum("bti,bto->io", np.asarray(inputs), np.asarray(grad))
    np.testing.assert_allclose(np.asarray(decoder.weight_grad(inputs, grad)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend, barrier", [("cpu", True), ("gpu", False), ("tpu", False)])
def test_head_weight_grad_uses_the_barriers_on_the_cpu_only_and_equals_inputs_t_grad(monkeypatch, backend,
                                                                                     barrier):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    inputs, grad = (jax.random.normal(jax.random.key(i), (2, 5, n)) for i, n in enumerate((6, 9)))
    assert ("optimization_barrier" in _primitives(head_weight_grad, inputs, grad)) == barrier
    expected = np.einsum("bti,bto->io", np.asarray(inputs), np.asarray(grad))
    np.testing.assert_allclose(np.asarray(head_weight_grad(inputs, grad)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
def test_a_projection_has_the_gradients_of_x_at_kernel_and_none_for_a_frozen_kernel(frozen):
    """`decoder.projection` (the attention projections' matmul) against numpy: d x = g W^T and
    d W = x^T g; a frozen kernel's gradient is not computed (its weight_grad is not in the jaxpr)."""
    x, kernel, g = (jax.random.normal(jax.random.key(i), shape)
                    for i, shape in enumerate(((2, 5, 6), (6, 4), (2, 5, 4))))
    freeze = jax.lax.stop_gradient if frozen else (lambda w: w)
    loss = lambda x, kernel: jnp.sum(decoder.projection(x, freeze(kernel)) * g)
    d_x, d_kernel = jax.grad(loss, argnums=(0, 1))(x, kernel)
    np.testing.assert_allclose(np.asarray(d_x), np.asarray(g) @ np.asarray(kernel).T, rtol=1e-5, atol=1e-5)
    expected = 0.0 if frozen else np.einsum("bti,bto->io", np.asarray(x), np.asarray(g))
    np.testing.assert_allclose(np.asarray(d_kernel), expected, rtol=1e-5, atol=1e-5)
    dots = len(list(dot_generals(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, kernel).jaxpr)))
    assert dots == (2 if frozen else 3)  # the forward matmul and d x; d W when trained
