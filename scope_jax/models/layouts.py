"""Which backend the XLA:CPU layout tricks are on (docs/models.md, "Layout tricks for XLA:CPU"), and the
bfloat16 residuals that cross a layer scan as bits there."""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp


def xla_cpu_layouts() -> bool:
    """Whether the layout tricks for XLA:CPU are on (`decoder.weight_grad`, `Block.decode_step`'s barrier,
    `logprobs.head_weight_grad`, `logprobs.vocab_sums`, `logprobs.logits_bytes`, attention's row
    groups, `residuals_as_bits`): they are selected by the default backend, so an accelerator runs the
    plain forms."""
    return jax.default_backend() == "cpu"


def residuals_as_bits(forward: Callable) -> Callable:
    """A custom VJP's forward rule whose bfloat16 residuals leave it bitcast to uint16 on XLA:CPU (undone by
    `residuals_from_bits` on the backward rule). A layer scan stacks the residuals, and XLA:CPU's float
    normalization rewrites a bfloat16 dynamic-update-slice as a float32 one over the whole stack,
    converted there and back at every layer; the same bits stack in place."""

    @functools.wraps(forward)
    def bits_out(*args):
        out, residuals = forward(*args)
        if not xla_cpu_layouts():
            return out, residuals
        as_bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x
        return out, jax.tree.map(as_bits, residuals)

    return bits_out


def residuals_from_bits(backward: Callable) -> Callable:
    """A custom VJP's backward rule, (*static, residuals, grad), that takes `residuals_as_bits`' residuals:
    every uint16 residual is a bfloat16 one's bits."""

    @functools.wraps(backward)
    def bits_in(*args):
        *static, residuals, grad = args
        from_bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x
        return backward(*static, jax.tree.map(from_bits, residuals), grad)

    return bits_in
