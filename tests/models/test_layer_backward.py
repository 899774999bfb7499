"""The SwiGLU MLP's written-out backward pass (norm included) against autodiff of a float64 reference, and
what a decoder layer keeps for its backward pass: each activation once."""

import collections

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import ModelConfig, init
from scope_jax.models.decoder import bind, normed_swiglu_mlp

EPS = 1e-5


def reference_mlp(x, norm_weight, w_gate, w_up, w_down):
    """float64 (silu(n W_gate) * n W_up) W_down of n = norm_weight * x / sqrt(mean(x^2) + eps)."""
    n = norm_weight * x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    return (jax.nn.silu(n @ w_gate) * (n @ w_up)) @ w_down


def test_normed_swiglu_mlp_values_and_gradients_equal_a_float64_reference():
    rng = np.random.default_rng(0)
    shapes = ((2, 5, 8), (8,), (8, 12), (8, 12), (12, 8))
    args = [jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)
            for shape, scale in zip(shapes, (3.0, 1.0, 0.5, 0.5, 0.5))]
    grad = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
    out, backward = jax.vjp(lambda *a: normed_swiglu_mlp(*a, EPS), *args)
    with jax.enable_x64():
        expected, reference_backward = jax.vjp(reference_mlp, *(a.astype(jnp.float64) for a in args))
        expected_grads = reference_backward(grad.astype(jnp.float64))
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)
    for name, ours, theirs in zip(("x", "norm weight", "gate", "up", "down"), backward(grad), expected_grads):
        assert ours.shape == theirs.shape, name
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_layer_keeps_each_activation_once():
    """Hand-counted for a 3-layer llama (no qk norm), batch 2 x 24 tokens, d 32, 4 query heads of 16 over
    2 kv heads, MLP width 48: the saved activations, stacked over the layers. The second norm's output is
    not kept (the MLP's backward pass computes it again from x) and the attention output is kept once,
    token-major, for both the attention's backward pass and the output projection's."""
    config = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16)
    graphdef, params = init(config, seed=0)
    tokens = jnp.zeros((2, 24), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(24), tokens.shape)
    _, backward = jax.vjp(lambda p: bind(graphdef, p).hidden(tokens, positions)[0], params)
    stacked = collections.Counter(leaf.shape[2:] for leaf in jax.tree.leaves(backward)
                                  if leaf.ndim >= 4 and leaf.shape[:2] == (3, 2))
    assert stacked == {
        (24, 32): 3,  # the layer's input (first norm's x), the first norm's output (q, k, v's input), the
        # second norm's x
        (24, 1): 2,  # each norm's inverse root
        (2, 48, 16): 1,  # the queries, each kv head's two query heads over 24 positions
        (2, 24, 16): 2,  # keys and values
        (2, 48): 1,  # the attention's log-sum-exp
        (24, 64): 1,  # the attention output, token-major (the output projection's input)
        (24, 48): 2,  # the MLP's gate and up projections
    }, stacked
