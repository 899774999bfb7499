"""cpu_gemm: MKL's sgemm as an XLA FFI custom call, against float64 NumPy products; when it is taken; and
its fallbacks (the decoder's, LoRA's and the head's gradients through it are in the parity tests'
`matmul_path` cases)."""

from __future__ import annotations

import importlib.metadata
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import cpu_gemm

# (m, k, n) of op(a) [m, k] @ op(b) [k, n]: one block; several row blocks (m >= n); several column blocks
# (n > m); uneven blocks; empty products and an empty contraction.
SHAPES = [(1, 1, 1), (7, 5, 3), (300, 17, 70), (70, 17, 300), (193, 33, 131), (0, 4, 5), (4, 5, 0), (6, 0, 5)]


def custom_calls(fn, *args) -> int:
    """The cpu_gemm custom calls of `fn` traced afresh (jax reuses a function's trace, made under the
    switch's setting then)."""
    text = jax.jit(lambda *args: fn(*args)).lower(*args).as_text()
    return sum(text.count(f"@{target}(") for target in cpu_gemm.TARGETS.values())


def reference(a, b, transpose_a, transpose_b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a.T if transpose_a else a) @ (b.T if transpose_b else b)


@pytest.mark.parametrize("transpose_a", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
def test_matmul_equals_the_float64_product_for_every_transpose_and_split(matmul_path, transpose_a,
                                                                         transpose_b):
    rng = np.random.default_rng(0)
    for m, k, n in SHAPES:
        a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
        product = lambda a, b: cpu_gemm.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        assert custom_calls(product, a, b) == (matmul_path == "1"), (m, k, n)
        got = np.asarray(jax.jit(product)(a, b))
        assert got.shape == (m, n)
        np.testing.assert_allclose(got, reference(a, b, transpose_a, transpose_b), rtol=0, atol=1e-4,
                                   err_msg=str((m, k, n)))


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False), (False, True)],
                         ids=["a-b", "aT-b", "a-bT"])
def test_a_bfloat16_product_accumulates_in_float32(matmul_path, transpose_a, transpose_b):
    """bfloat16 operands (exact in float64): the float32 product against the float64 one, and the
    bfloat16 product its rounding. MKL's bfloat16 GEMM needs a CPU with bfloat16 instructions."""
    if matmul_path == "1" and not cpu_gemm.cpu_has_bf16():
        pytest.skip("no bfloat16 instructions on this CPU: XLA's dot (the other case)")
    rng = np.random.default_rng(2)
    for m, k, n in [(300, 40, 70), (70, 40, 300), (5, 3, 2)]:
        a = jnp.asarray(rng.standard_normal((k, m) if transpose_a else (m, k)), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal((n, k) if transpose_b else (k, n)), jnp.bfloat16)
        product = lambda a, b, out: cpu_gemm.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b,
                                                    preferred_element_type=out)
        assert custom_calls(lambda a, b: product(a, b, None), a, b) == (matmul_path == "1")
        want = reference(a.astype(jnp.float32), b.astype(jnp.float32), transpose_a, transpose_b)
        np.testing.assert_allclose(np.asarray(jax.jit(product, static_argnums=2)(a, b, jnp.float32)), want,
                                   rtol=0, atol=1e-4)
        got = np.asarray(jax.jit(product, static_argnums=2)(a, b, None).astype(jnp.float32))
        np.testing.assert_allclose(got, want, rtol=2**-8, atol=1e-6)


def test_under_vmap_each_member_gets_its_own_product(matmul_path):
    """A population's vmap: both operands batched, or one shared (broadcast to the batch)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 130, 20)).astype(np.float32)
    b = rng.standard_normal((3, 7, 20)).astype(np.float32)
    both = jax.jit(jax.vmap(lambda a, b: cpu_gemm.matmul(a, b, transpose_b=True)))(a, b)
    shared = jax.jit(jax.vmap(lambda a: cpu_gemm.dense(a, b[1], transpose_kernel=True)))(a)
    for member in range(3):
        np.testing.assert_allclose(np.asarray(both[member]), reference(a[member], b[member], False, True),
                                   atol=1e-4)
        np.testing.assert_allclose(np.asarray(shared[member]), reference(a[member], b[1], False, True),
                                   atol=1e-4)


def test_dense_keeps_the_leading_axes():
    x, kernel = jnp.ones((2, 3, 4)), jnp.ones((5, 4))
    assert cpu_gemm.dense(x, kernel, transpose_kernel=True).shape == (2, 3, 5)


def test_mkl_is_taken_for_float32_and_bfloat16_and_by_the_switch(monkeypatch):
    f32, bf16, f16 = jnp.ones((4, 4)), jnp.ones((4, 4), jnp.bfloat16), jnp.ones((4, 4), jnp.float16)
    monkeypatch.setenv(cpu_gemm.SWITCH, "auto")  # the suite's eight devices: XLA's dot
    assert jax.device_count() > 1 and custom_calls(cpu_gemm.matmul, f32, f32) == 0
    monkeypatch.setenv(cpu_gemm.SWITCH, "1")
    assert custom_calls(cpu_gemm.matmul, f32, f32) == 1
    assert custom_calls(cpu_gemm.matmul, bf16, bf16) == cpu_gemm.cpu_has_bf16()
    assert custom_calls(cpu_gemm.matmul, f32, bf16) == custom_calls(cpu_gemm.matmul, f16, f16) == 0
    assert cpu_gemm.matmul(bf16, bf16).dtype == jnp.bfloat16
    assert cpu_gemm.matmul(bf16, bf16, preferred_element_type=jnp.float32).dtype == jnp.float32
    monkeypatch.setenv(cpu_gemm.SWITCH, "yes")
    with pytest.raises(ValueError, match="expected 0 .off., 1"):
        cpu_gemm.matmul(f32, f32)


def test_operands_that_do_not_multiply_are_refused():
    with pytest.raises(ValueError, match="2-D operands"):
        cpu_gemm.matmul(jnp.ones((2, 3, 4)), jnp.ones((4, 5)))
    with pytest.raises(ValueError, match="do not multiply"):
        cpu_gemm.matmul(jnp.ones((2, 3)), jnp.ones((2, 5)))


def test_a_failed_build_is_one_line_and_falls_back_to_xla_logged(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached: the compiler must run
    with pytest.raises(RuntimeError, match=r"'false' failed to build cpu_gemm.cc \(exit 1\)"):
        cpu_gemm.build("false")
    with pytest.raises(RuntimeError, match="cannot run the C\\+\\+ compiler 'no-such-compiler'"):
        cpu_gemm.build("no-such-compiler")
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level(logging.WARNING, logger=cpu_gemm.__name__):
        assert cpu_gemm.handler_registered.__wrapped__() is False
    assert "the matmuls use XLA's dot" in caplog.text and "'false' failed" in caplog.text
    assert not list(tmp_path.glob("scope_jax/*.so"))


def test_without_mkl_installed_the_handler_falls_back_logged(monkeypatch, caplog):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    monkeypatch.setattr(cpu_gemm, "mkl", cpu_gemm.mkl.__wrapped__)  # not the process's loaded MKL
    with caplog.at_level(logging.WARNING, logger=cpu_gemm.__name__):
        assert cpu_gemm.handler_registered.__wrapped__() is False
    assert "the mkl package is not installed" in caplog.text
