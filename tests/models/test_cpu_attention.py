"""MKL's attention kernel on XLA:CPU (`cpu_attention`) against a float64 numpy softmax and autodiff of a
plain jnp softmax, over several 64-query and 64-key tiles, shuffled key positions, padding and queries
that see nothing; its bfloat16 form against the same references at bfloat16 round-off; under vmap; and
where it runs (`matmul_path`: "0" checks XLA's form on the same cases)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import attention, cpu_attention, cpu_gemm
from tests.jaxprs import equations
from tests.models.test_attention import plain, reference

N, H, Q, S, D = 2, 2, 150, 200, 16  # three query tiles (64, 64, 22), four key tiles (the last of 8)
NO_QUERY, NO_KEY = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def case(seed=0, dtype=jnp.float32):
    """Row 0: causal, its queries the last Q of the keys' positions. Row 1: keys at positions 100.. in a
    shuffled order with four padding keys, queries at 0..Q-1 with one padding query, so that its first
    query tile sees no key tile and the second sees some (scattered) tiles."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(N, H, n, D)) for n in (Q, S, S))
    k_pos = np.stack([np.arange(S), 100 + rng.permutation(S)])
    k_pos[1, rng.choice(S, 4, replace=False)] = NO_KEY
    q_pos = np.stack([np.arange(S - Q, S), np.arange(Q)])
    q_pos[1, 120] = NO_QUERY
    arrays = (jnp.asarray(x, dtype) for x in (q, k, v))
    return (*arrays, *(jnp.asarray(x, jnp.int32) for x in (q_pos, k_pos)))


def sees_something(q_pos, k_pos):
    return np.asarray((k_pos[:, None, :] <= q_pos[:, :, None]).any(-1))  # [N, Q]


def loss_weights(q_pos, k_pos, seed=2):
    """Random output weights, 0 for queries that see nothing (the plain softmax averages every key there)."""
    weights = np.random.default_rng(seed).normal(size=(N, H, Q, D))
    return jnp.asarray(weights * sees_something(q_pos, k_pos)[:, None, :, None], jnp.float32)


def custom_calls(fn, *args) -> int:
    return sum(eqn.primitive.name == "ffi_call" for eqn in equations(jax.make_jaxpr(fn)(*args).jaxpr))


def test_the_case_covers_the_tiles():
    q_pos, k_pos = case()[3:]
    seen = sees_something(q_pos, k_pos)
    assert not seen[1, :64].any() and seen[1, 100:].sum() == Q - 100 - 1 and seen[0].all()


def test_the_kernel_matches_numpy_and_autodiff_across_tiles(matmul_path):
    q, k, v, q_pos, k_pos = case()
    ours = lambda q, k, v: attention.attention(q, k, v, q_pos, k_pos)
    assert custom_calls(ours, q, k, v) == (1 if matmul_path == "1" else 0)
    expected = reference(q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(np.asarray(jax.jit(ours)(q, k, v)), expected, atol=2e-6)

    weights = loss_weights(q_pos, k_pos)
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * weights)
    gradients = jax.grad(loss(ours), argnums=(0, 1, 2))
    assert custom_calls(gradients, q, k, v) == (2 if matmul_path == "1" else 0)
    expected = jax.grad(loss(lambda q, k, v: plain(q, k, v, q_pos, k_pos)), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", jax.jit(gradients)(q, k, v), expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)


def test_a_decode_step_sees_its_cache_up_to_its_position(matmul_path):
    """Three query heads of one new token per row over a 100-slot cache, the slots past its position not
    yet written (random here, and invisible)."""
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.normal(size=(N, H, 3, D)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(N, H, 100, D)), jnp.float32) for _ in range(2))
    k_pos = jnp.broadcast_to(jnp.arange(100, dtype=jnp.int32), (N, 100))
    q_pos = jnp.asarray([[40] * 3, [99] * 3], jnp.int32)
    step = jax.jit(lambda q, k, v: attention.attention(q, k, v, q_pos, k_pos))
    assert custom_calls(step, q, k, v) == (1 if matmul_path == "1" else 0)
    np.testing.assert_allclose(np.asarray(step(q, k, v)), reference(q, k, v, q_pos, k_pos), atol=2e-6)


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setenv(cpu_gemm.SWITCH, "1")
    if not cpu_attention.handler_registered():
        pytest.skip("no MKL here (tests/conftest.py's matmul_path fails on x86-64 Linux instead)")


def test_bfloat16_stays_within_bfloat16_round_off_of_float64(kernel):
    """Operands, probabilities (for the products) and output in bfloat16, accumulation in float32: the
    probabilities' relative round-off 2^-9 and the output's own bring each output within a few 2^-9 of
    max |v| of the float64 softmax over the same bfloat16 inputs; so for the gradients, relative to their
    own largest entry."""
    if not cpu_gemm.cpu_has_bf16():
        pytest.skip("no bfloat16 instructions: XLA's form runs")
    q, k, v, q_pos, k_pos = case(seed=1, dtype=jnp.bfloat16)
    ours = lambda q, k, v: attention.attention(q, k, v, q_pos, k_pos)
    assert custom_calls(ours, q, k, v) == 1
    out = np.asarray(jax.jit(ours)(q, k, v).astype(jnp.float32))
    as_float = [x.astype(jnp.float32) for x in (q, k, v)]
    bound = 4 * 2.0**-9 * float(jnp.abs(as_float[2]).max())
    np.testing.assert_allclose(out, reference(*as_float, q_pos, k_pos), atol=bound)

    weights = loss_weights(q_pos, k_pos)
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * weights)
    gradients = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
    expected = jax.grad(loss(lambda q, k, v: plain(q, k, v, q_pos, k_pos)), argnums=(0, 1, 2))(*as_float)
    for name, a, b in zip("qkv", gradients, expected):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a.astype(jnp.float32)), b, atol=8 * 2.0**-9 * np.abs(b).max(),
                                   err_msg=name)


def test_under_vmap_each_member_gets_its_own_attention(kernel):
    members = [case(seed) for seed in (3, 4)]
    stacked = [jnp.stack(x) for x in zip(*members)]
    fn = lambda q, k, v, q_pos, k_pos: attention.attention(q, k, v, q_pos, k_pos)
    together = jax.jit(jax.vmap(fn))(*stacked)
    for i, member in enumerate(members):
        np.testing.assert_allclose(np.asarray(together[i]), np.asarray(jax.jit(fn)(*member)), atol=1e-6)


def test_operands_of_other_shapes_are_refused_in_one_line(kernel):
    q, k, v, q_pos, k_pos = case()
    with pytest.raises(Exception, match="cpu_attention: keys and values differ in shape"):
        cpu_attention.forward(q, k, v[..., :8], q_pos, k_pos)
    with pytest.raises(Exception, match="cpu_attention: heads, lengths or head dims differ"):
        cpu_attention.forward(q, k, v, q_pos[:, :-1], k_pos)
    out, lse = cpu_attention.forward(q, k, v, q_pos, k_pos)
    with pytest.raises(Exception, match="cpu_attention: grad .* must match q"):
        cpu_attention.backward(q, k, v, q_pos, k_pos, out[:, :, :-1], lse, lse)


def test_the_kernel_runs_on_xla_cpu_only(kernel, monkeypatch):
    q, k, v = case()[:3]
    assert cpu_attention.uses_kernel(q, k, v)
    assert not cpu_attention.uses_kernel(q, k, v.astype(jnp.bfloat16))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not cpu_attention.uses_kernel(q, k, v)


def test_a_failed_build_falls_back_to_xla_logged(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached: the compiler must run
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level(logging.WARNING, logger=cpu_attention.__name__):
        assert cpu_attention.handler_registered.__wrapped__() is False
    assert "attention runs as XLA ops" in caplog.text
    assert "'false' failed to build cpu_attention.cc" in caplog.text
