"""The XLA:CPU layout tricks are selected by backend: on an accelerator the plain forms run, with the same
values (docs/models.md, "Speed on a CPU")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.logprobs import head_weight_grad, token_logprobs, vocab_sums
from scope_jax.models import ModelConfig, attention, decoder, layouts
from tests.jaxprs import dot_generals, equations


def _primitives(fn, *args) -> set[str]:
    # a new function per call: a traced jaxpr cached from another backend setting must not answer
    return {eqn.primitive.name for eqn in jax.make_jaxpr(lambda *a: fn(*a))(*args).jaxpr.eqns}


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_weight_grad_uses_the_barrier_on_the_cpu_only_and_equals_inputs_t_grad(monkeypatch, matmul_path,
                                                                               backend):
    """On the CPU the barrier form of XLA's dot, or MKL (`cpu_gemm`); elsewhere the plain product."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    inputs, grad = (jax.random.normal(jax.random.key(i), (2, 5, n)) for i, n in enumerate((6, 4)))
    primitives = _primitives(decoder.weight_grad, inputs, grad)
    assert ("optimization_barrier" in primitives) == (backend == "cpu" and matmul_path == "0")
    assert ("ffi_call" in primitives) == (backend == "cpu" and matmul_path == "1")
    expected = np.einsum("bti,bto->io", np.asarray(inputs), np.asarray(grad))
    np.testing.assert_allclose(np.asarray(decoder.weight_grad(inputs, grad)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("vocab_major", [False, True], ids=["d-by-vocab", "vocab-major"])
def test_head_weight_grad_uses_the_barriers_on_the_cpu_only_and_equals_inputs_t_grad(monkeypatch, matmul_path,
                                                                                     backend, vocab_major):
    """inputs^T grad [d, vocab], or its transpose [vocab, d] for a vocab-major (tied) head."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    inputs, grad = (jax.random.normal(jax.random.key(i), (2, 5, n)) for i, n in enumerate((6, 9)))
    primitives = _primitives(lambda i, g: head_weight_grad(i, g, vocab_major), inputs, grad)
    assert ("optimization_barrier" in primitives) == (backend == "cpu" and matmul_path == "0")
    assert ("ffi_call" in primitives) == (backend == "cpu" and matmul_path == "1")
    expected = np.einsum("bti,bto->io", np.asarray(inputs), np.asarray(grad))
    np.testing.assert_allclose(np.asarray(head_weight_grad(inputs, grad, vocab_major)),
                               expected.T if vocab_major else expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
def test_a_projection_has_the_gradients_of_x_at_kernel_and_none_for_a_frozen_kernel(frozen, matmul_path):
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
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, kernel).jaxpr
    ffi_calls = sum(eqn.primitive.name == "ffi_call" for eqn in equations(jaxpr))
    matmuls = len(list(dot_generals(jaxpr))) + ffi_calls
    assert matmuls == (2 if frozen else 3)  # the forward matmul and d x; d W when trained


@pytest.mark.parametrize("vocab, rows", [(48, 16), (40, 8), (7, 1)])
@pytest.mark.parametrize("backend, variadic", [("cpu", True), ("gpu", False), ("tpu", False)])
def test_vocab_sums_run_as_one_variadic_reduce_down_rows_on_the_cpu_only_and_equal_the_sums(
        monkeypatch, backend, variadic, vocab, rows):
    """On the CPU the terms go through one variadic `reduce` over an axis of `rows` (the greatest common
    divisor of the vocabulary and VOCAB_SUM_ROWS, 16); elsewhere each is a plain sum. Values against
    numpy."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    terms = tuple(jax.random.normal(jax.random.key(i), (2, 3, vocab)) for i in range(3))
    jaxpr = jax.make_jaxpr(lambda *t: vocab_sums(t))(*terms).jaxpr
    reduces = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "reduce"]
    assert len(reduces) == (1 if variadic else 0)
    if variadic:
        assert len(reduces[0].invars) == 2 * len(terms)  # the operands and their initial values
        assert reduces[0].invars[0].aval.shape == (2, 3, rows, vocab // rows)
    for total, term in zip(vocab_sums(terms), terms):
        expected = np.asarray(term, np.float64).sum(-1)
        np.testing.assert_allclose(np.asarray(total), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("queries", [3, 16, 17])
@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_few_queries_take_keys_major_scores_on_the_cpu_only_with_the_same_values(monkeypatch, backend,
                                                                                 queries):
    """A decode step's few queries per (row, kv head): on the CPU the scores come from keys @ queries^T
    behind a barrier, elsewhere (and for more than FEW_QUERIES queries) from queries @ keys^T. Values and
    visibility against numpy."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    q, k = (jax.random.normal(jax.random.key(i), (2, 3, n, 8)) for i, n in enumerate((queries, 40)))
    q_pos = jnp.broadcast_to(jnp.arange(queries) + 20, (2, queries))
    k_pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
    scores = lambda q, k: attention._scores(q, k, q_pos, k_pos)
    barrier = backend == "cpu" and queries <= attention.FEW_QUERIES
    assert ("optimization_barrier" in _primitives(scores, q, k)) == barrier
    values, visible = scores(q, k)
    expected = np.einsum("nhqd,nhsd->nhqs", np.asarray(q, np.float64), np.asarray(k, np.float64)) / np.sqrt(8)
    np.testing.assert_allclose(np.asarray(values), expected, rtol=1e-5, atol=1e-5)
    expected_visible = np.asarray(k_pos)[:, None, :] <= np.asarray(q_pos)[:, :, None]
    np.testing.assert_array_equal(np.asarray(visible)[:, 0], expected_visible)


def _bfloat16_step_hlo_and_grads():
    """(compiled HLO text, gradient) of a 3-layer model's bfloat16 log-prob gradient (float32 weights)."""
    config = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_layers=3, num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    graphdef, params = decoder.init(config, seed=0, dtype=jnp.bfloat16)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)))
    positions = jnp.broadcast_to(jnp.arange(9), tokens.shape)
    grad_fn = jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(graphdef, p, tokens, positions).logprobs)))
    return grad_fn.lower(params).compile().as_text(), grad_fn(params)


def test_bfloat16_residuals_cross_the_layer_scan_as_bits_on_the_cpu(monkeypatch):
    """`layouts.residuals_as_bits`: the custom VJPs' bfloat16 residuals leave their forward rules as uint16
    bits on XLA:CPU, so the layer scan stacks them in place. XLA:CPU's float normalization makes a bfloat16
    stack's dynamic-update-slice a float32 one of the converted stack (copied there and back every layer):
    none is left in the compiled bfloat16 gradient, where the plain residuals (the wrapper seeing an
    accelerator) give some; the gradients are bit-equal."""
    normalized = lambda hlo: hlo.count("dynamic-update-slice(%convert")
    hlo, grads = _bfloat16_step_hlo_and_grads()
    monkeypatch.setattr(layouts, "xla_cpu_layouts", lambda: False)  # only the wrapper looks it up there
    plain_hlo, plain_grads = _bfloat16_step_hlo_and_grads()
    assert normalized(hlo) == 0
    assert normalized(plain_hlo) > 0, "XLA:CPU no longer normalizes a bfloat16 stack: the wrapper may go"
    for ours, plain in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(plain, np.float32))
