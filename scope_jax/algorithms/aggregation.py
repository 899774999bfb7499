"""Loss aggregation: per-token losses [B, L] and a float loss mask [B, L] -> one scalar float32.

All modes are registered in `AGGREGATIONS` as `fn(loss, mask) -> scalar`. They are linear in the loss, so
summing per-token loss terms before or after aggregating is the same. An empty mask (no tokens at all, or a
sequence without tokens) never divides by zero: such parts contribute 0, with finite gradients.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from scope_jax.algorithms.registry import Registry, register

AGGREGATIONS = Registry("loss aggregation")


def _per_sequence_sums(loss: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum_t mask_bt * loss_bt, sum_t mask_bt), both [B] float32."""
    chex.assert_rank(loss, 2)
    chex.assert_equal_shape([loss, mask])
    mask = mask.astype(jnp.float32)
    return jnp.sum(loss.astype(jnp.float32) * mask, axis=-1), jnp.sum(mask, axis=-1)


def _divide_or_zero(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator where denominator > 0, else 0 (the inner where keeps gradients finite)."""
    positive = denominator > 0
    return jnp.where(positive, numerator / jnp.where(positive, denominator, 1.0), 0.0)


@register(AGGREGATIONS, "token_mean")
def token_mean(loss: jax.Array, mask: jax.Array) -> jax.Array:
    """sum_{b,t} mask_bt * loss_bt / sum_{b,t} mask_bt: every token in the batch weighs the same."""
    sums, counts = _per_sequence_sums(loss, mask)
    return _divide_or_zero(jnp.sum(sums), jnp.sum(counts))


@register(AGGREGATIONS, "seq_mean_token_mean")
def seq_mean_token_mean(loss: jax.Array, mask: jax.Array) -> jax.Array:
    """mean over sequences b with sum_t mask_bt > 0 of (sum_t mask_bt * loss_bt / sum_t mask_bt).

    Every sequence weighs the same whatever its length (GRPO's original normalisation).
    """
    sums, counts = _per_sequence_sums(loss, mask)
    return _divide_or_zero(jnp.sum(_divide_or_zero(sums, counts)), jnp.sum(counts > 0))


@register(AGGREGATIONS, "seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(loss: jax.Array, mask: jax.Array) -> jax.Array:
    """(1 / B) * sum_b (sum_t mask_bt * loss_bt) / L, with the constant normaliser L = loss.shape[1].

    Dr. GRPO's length-unbiased mode: no per-sequence length in the denominator, and the mean is over all B
    sequences. L is the padded length, so pad every batch to the same maximum length for a fixed scale.
    """
    sums, _ = _per_sequence_sums(loss, mask)
    return jnp.mean(sums) / loss.shape[1]
