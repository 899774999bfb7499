"""Token entropy of the policy and the entropy bonus loss term."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def token_entropy(logits: jax.Array) -> jax.Array:
    """H_t = -sum_v p_tv log p_tv with p_t = softmax(logits_t); logits [B, L, V] -> entropy [B, L] float32.

    Computed in float32 from log_softmax (max-shifted), so large logits neither overflow nor lose the
    small probabilities. Logits must be finite: mask a vocabulary entry with a large negative number, not
    -inf (0 * -inf is nan).
    """
    chex.assert_rank(logits, 3)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_bonus(entropy: jax.Array, coef: float) -> jax.Array:
    """Per-token loss term -coef * H_t, [B, L] float32: minimising the loss with it raises the entropy."""
    chex.assert_rank(entropy, 2)
    return -coef * entropy.astype(jnp.float32)
