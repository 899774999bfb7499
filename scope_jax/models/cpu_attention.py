"""Attention's forward and backward pass on XLA:CPU as one FFI custom call each (docs/models.md, "Attention
on XLA:CPU").

`forward` and `backward` compute what attention.py's one tile computes, for queries q [N, H, Q, d], keys
and values [N, H, S, d] and positions [N, Q], [N, S], in `cpu_attention.cc`: each (row, head) a task on
XLA's intra-op threads, its queries 64 at a time over the 64-key tiles that some of them see (a causal
mask leaves out the tiles above the diagonal, which XLA's one tile computes and masks), the products
through MKL's single-threaded GEMM and exp through MKL's vector exp. Nothing of size Q x S is kept.

`attention.attention` takes them (training, and forward only the prefill and decode steps over a row's
own cache); attention over a shared prompt prefix (`accumulate`) stays XLA's. `uses_kernel(q, k, v)` says
whether they run: where `cpu_gemm.uses_mkl` would take MKL for q and k (XLA:CPU, float32 or bfloat16 with
the CPU's bfloat16 instructions, one device or `SCOPE_JAX_CPU_GEMM=1`), for three operands of one dtype,
once the handler is built (as cpu_gemm's, on first use). Otherwise attention.py runs its XLA form.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from scope_jax.models import cpu_gemm

SOURCE = Path(__file__).with_name("cpu_attention.cc")
TARGETS = {jnp.dtype(jnp.float32): ("scope_jax_attention_forward", "scope_jax_attention_backward"),
           jnp.dtype(jnp.bfloat16): ("scope_jax_attention_forward_bf16", "scope_jax_attention_backward_bf16")}


def uses_kernel(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether `forward` and `backward` take these operands (see the module docstring)."""
    return k.dtype == v.dtype and cpu_gemm.uses_mkl(q, k) and handler_registered()


def forward(q, k, v, q_pos, k_pos) -> tuple[jax.Array, jax.Array]:
    """The attention output [N, H, Q, d] in float32 and each query's log-sum-exp of its visible scores
    [N, H, Q] (+inf for a query that sees nothing, whose output is 0)."""
    _require_handler()
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call(TARGETS[q.dtype][0], out, vmap_method="broadcast_all")(
        q, k, v, q_pos.astype(jnp.int32), k_pos.astype(jnp.int32))


def backward(q, k, v, q_pos, k_pos, grad, lse, delta) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) in float32 from the output gradient `grad` [N, H, Q, d], `forward`'s log-sum-exp and
    delta = sum(grad * out) [N, H, Q]; the products take q's dtype and accumulate in float32."""
    _require_handler()
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(k.shape, jnp.float32),
           jax.ShapeDtypeStruct(v.shape, jnp.float32))
    return jax.ffi.ffi_call(TARGETS[q.dtype][1], out, vmap_method="broadcast_all")(
        q, k, v, q_pos.astype(jnp.int32), k_pos.astype(jnp.int32), grad.astype(q.dtype), lse, delta)


def _require_handler() -> None:
    if not handler_registered():
        raise RuntimeError("cpu_attention: the handler is unavailable (see the logged warning); "
                           "`uses_kernel` says when to call it")


@functools.cache
def handler_registered() -> bool:
    """Build (or find cached), load and register the handlers once per process; False, logged, on
    failure."""
    symbols = {jnp.dtype(jnp.float32): ("AttentionForward", "AttentionBackward"),
               jnp.dtype(jnp.bfloat16): ("AttentionForwardBf16", "AttentionBackwardBf16")}
    targets = {name: symbol for dtype in TARGETS for name, symbol in zip(TARGETS[dtype], symbols[dtype])}
    return cpu_gemm.registered(SOURCE, ("cblas_sgemm_64", "cblas_gemm_bf16bf16f32_64", "vsExp_64"), targets,
                               "attention runs as XLA ops")
