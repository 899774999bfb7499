"""The XLA:CPU layout tricks are selected by backend: on an accelerator the plain forms run, with the same
values (docs/models.md, "Speed on a CPU")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import decoder


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
