"""Log-probabilities and entropies of given tokens, for training.

Everything is aligned with the token ids: `logprobs[b, t] = log p(tokens[b, t] | tokens[b, :t])` and
`entropy[b, t]` is the entropy of that predictive distribution; position 0 (no prefix) holds 0. A loss
mask over tokens therefore selects exactly the tokens a role sampled. With `allowed` token ids (a role
that samples under constrained decoding), p is the softmax restricted to them, the distribution the
tokens were drawn from; other tokens get log-prob about -1e9, so mask them out.

The output head runs over sequence chunks, so neither the forward nor the backward pass ever holds the
full (batch x length x vocab) logits: only one chunk's. The backward pass looks at a chunk's logits again
(`jax.checkpoint`), except where it need not: when the entropy is a metric rather than a loss term
(`entropy_gradient=False`) and the head weight is frozen (a LoRA base), the forward pass already computes
each log-prob's gradient with respect to the hidden state, one matmul instead of two.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx
from jax.custom_derivatives import SymbolicZero

from scope_jax.models.decoder import Params, bind


class TokenStats(NamedTuple):
    logprobs: jax.Array  # [B, L] float32
    entropy: jax.Array  # [B, L] float32


def _logits(hidden: jax.Array, weight: jax.Array, temperature: float, allowed: jax.Array | None) -> jax.Array:
    """Float32 hidden @ weight / temperature; -1e9 outside `allowed` (bool [V]): finite, since 0 * -inf
    would be nan in the entropy."""
    logits = jnp.einsum("...d,dv->...v", hidden, weight.astype(hidden.dtype),
                        preferred_element_type=jnp.float32) / temperature
    return logits if allowed is None else jnp.where(allowed, logits, -1e9)


def _softmax_stats(logits: jax.Array, targets: jax.Array) -> tuple[TokenStats, jax.Array]:
    """(log p(target) and entropy, the probabilities) of softmax(logits)."""
    # exp once and sum it: XLA:CPU runs logsumexp's fused exp-and-sum several times slower
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    unnormalized = jnp.exp(logits - top)
    total = jnp.sum(unnormalized, axis=-1)
    lse, probs = top[..., 0] + jnp.log(total), unnormalized / total[..., None]
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return TokenStats(target_logits - lse, lse - jnp.sum(probs * logits, axis=-1)), probs


def head_stats(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
               temperature: float = 1.0, allowed: jax.Array | None = None) -> TokenStats:
    """log p(target) and entropy of softmax(hidden @ weight / temperature), in float32; with `allowed`
    (bool [V]) the softmax is restricted to the allowed tokens."""
    return _softmax_stats(_logits(hidden, weight, temperature, allowed), targets)[0]


def _allowed_mask(allowed: tuple[int, ...] | None, vocab: int) -> jax.Array | None:
    return None if allowed is None else jnp.zeros(vocab, bool).at[jnp.asarray(allowed)].set(True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def metric_entropy_stats(hidden: jax.Array, weight: jax.Array, targets: jax.Array, temperature: float,
                         allowed: tuple[int, ...] | None) -> TokenStats:
    """`head_stats` (allowed: token ids) whose entropy is a metric: differentiating it raises. With a frozen
    `weight` the forward pass keeps d log p(target) / d hidden, so the backward pass runs no matmul."""
    return head_stats(hidden, weight, targets, temperature, _allowed_mask(allowed, weight.shape[-1]))


def _metric_entropy_forward(hidden, weight, targets, temperature, allowed):
    h, w, t = hidden.value, weight.value, targets.value
    mask = _allowed_mask(allowed, w.shape[-1])
    if weight.perturbed:  # the weight's gradient needs the logits again: keep the inputs only
        return head_stats(h, w, t, temperature, mask), (h, w, t, None)
    stats, probs = _softmax_stats(_logits(h, w, temperature, mask), t)
    # d log p(t) / d logits = onehot(t) - probs (0 outside `allowed`); d logits / d h = W^T / temperature
    target_rows = w.T[t].astype(jnp.float32) * (1.0 if mask is None else mask[t][..., None])
    expected_row = jnp.einsum("...v,dv->...d", probs.astype(h.dtype), w.astype(h.dtype),
                              preferred_element_type=jnp.float32)
    return stats, (None, None, None, ((target_rows - expected_row) / temperature).astype(h.dtype))


def _metric_entropy_backward(temperature, allowed, residuals, grad: TokenStats):
    if not isinstance(grad.entropy, SymbolicZero):
        raise ValueError("this entropy is a metric: token_logprobs(..., entropy_gradient=True) "
                         "differentiates it")
    h, w, t, d_hidden = residuals
    if isinstance(grad.logprobs, SymbolicZero):
        return None, None, None
    if d_hidden is not None:
        return (grad.logprobs[..., None] * d_hidden).astype(d_hidden.dtype), None, None
    mask = _allowed_mask(allowed, w.shape[-1])
    _, backward = jax.vjp(lambda h, w: head_stats(h, w, t, temperature, mask).logprobs, h, w)
    return (*backward(grad.logprobs), None)


metric_entropy_stats.defvjp(_metric_entropy_forward, _metric_entropy_backward, symbolic_zeros=True)


def token_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, positions: jax.Array, *,
                   chunk_size: int = 128, temperature: float = 1.0,
                   allowed: tuple[int, ...] | None = None, entropy_gradient: bool = True) -> TokenStats:
    """Per-token log-probs and entropies of `tokens` [B, L] under the model (see module docstring); with
    entropy_gradient=False the entropy is a metric (`metric_entropy_stats`)."""
    chex.assert_rank([tokens, positions], 2)
    model = bind(graphdef, params)
    hidden, _ = model.hidden(tokens, positions)
    weight = model.head_weight()
    batch, length, dim = hidden.shape
    # Hidden state t predicts token t + 1.
    hidden, targets = hidden[:, :-1], tokens[:, 1:]
    chunk = min(chunk_size, length - 1)
    padded = -(-(length - 1) // chunk) * chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, padded - (length - 1)), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, padded - (length - 1))))
    hidden = hidden.reshape(batch, padded // chunk, chunk, dim).swapaxes(0, 1)
    targets = targets.reshape(batch, padded // chunk, chunk).swapaxes(0, 1)

    if entropy_gradient:
        mask = _allowed_mask(allowed, weight.shape[-1])
        per_chunk = jax.checkpoint(lambda h, t: head_stats(h, weight, t, temperature, mask))
    else:
        per_chunk = lambda h, t: metric_entropy_stats(h, weight, t, temperature, allowed)
    stats = jax.lax.map(lambda ht: per_chunk(*ht), (hidden, targets))
    unchunk = lambda x: jnp.pad(x.swapaxes(0, 1).reshape(batch, padded)[:, :length - 1], ((0, 0), (1, 0)))
    return TokenStats(*map(unchunk, stats))
