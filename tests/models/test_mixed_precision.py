"""Mixed precision: a decoder computing in bfloat16 from float32 master weights runs its matmuls in
bfloat16, returns float32 gradients, and stays within bfloat16 round-off of the float32 model (whose own
forward and gradients are checked against transformers in test_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.logprobs import token_logprobs
from scope_jax.models import decoder
from scope_jax.models.tiny import tiny_config
from tests.jaxprs import dot_generals


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, ...]]:
    """The operand dtypes of every dot_general in `jaxpr` and the jaxprs nested in it."""
    return [tuple(str(v.aval.dtype) for v in eqn.invars) for eqn in dot_generals(jaxpr)]


def test_bfloat16_compute_from_float32_weights_is_the_float32_model_to_bfloat16_round_off():
    config = tiny_config(64)
    graphdef32, params = decoder.init(config, seed=0)
    graphdef16, _ = decoder.init(config, seed=0, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 16)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(16), tokens.shape)

    def loss(graphdef, params):
        return -jnp.mean(token_logprobs(graphdef, params, tokens, positions, chunk_size=8).logprobs[:, 1:])

    loss16, grads16 = jax.jit(jax.value_and_grad(lambda p: loss(graphdef16, p)))(params)
    loss32, grads32 = jax.jit(jax.value_and_grad(lambda p: loss(graphdef32, p)))(params)
    assert {g.dtype for g in jax.tree.leaves(grads16)} == {jnp.dtype(jnp.float32)}
    operands = _dot_operand_dtypes(jax.make_jaxpr(jax.grad(lambda p: loss(graphdef16, p)))(params).jaxpr)
    assert operands and ("float32", "float32") not in operands, operands
    assert abs(float(loss16) - float(loss32)) < 1e-2 * abs(float(loss32))
    flat16, flat32 = (np.concatenate([np.ravel(g) for g in jax.tree.leaves(t)]) for t in (grads16, grads32))
    cosine = flat16 @ flat32 / np.linalg.norm(flat16) / np.linalg.norm(flat32)
    assert cosine > 0.99, cosine
