"""PPO-style clipped surrogate policy loss, per token, with clip-higher and an optional dual clip."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def clipped_policy_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-token clipped surrogate loss (to minimise) and a per-token clip indicator, both [B, L] float32.

    With the ratio rho = exp(logp_new - logp_old) and advantage A (per sequence [B], broadcast over tokens,
    or per token [B, L]):

        loss = max(-A * rho, -A * clip(rho, 1 - epsilon_low, 1 + epsilon_high))

    `epsilon_high > epsilon_low` is DAPO's clip-higher. With `dual_clip = c > 1` (Dual-Clip PPO, Ye et al.
    2020) the loss of a token with A < 0 is further capped at c * |A| = -c * A, so a huge ratio on a bad
    token cannot dominate the update:

        loss = min(loss, -c * A)   where A < 0

    The indicator is 1 where a clip is active, i.e. where the loss is constant in logp_new and the token
    contributes no gradient; aggregated with the loss mask it is the clip fraction. `logp_old` (the
    behaviour policy's log-probs) is held constant by a stop-gradient, so a single on-policy step may pass
    `logp_old = logp_new`. Masked-out positions must hold finite log-probs (0 is fine): the aggregation
    multiplies by the mask, and inf * 0 is nan.
    """
    chex.assert_rank([logp_new, logp_old], 2)
    chex.assert_equal_shape([logp_new, logp_old])
    chex.assert_rank(advantages, {1, 2})
    chex.assert_equal_shape_prefix([logp_new, advantages], advantages.ndim)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    advantages = advantages.astype(jnp.float32)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    log_ratio = logp_new.astype(jnp.float32) - jax.lax.stop_gradient(logp_old.astype(jnp.float32))
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if dual_clip is not None:
        cap = -dual_clip * advantages
        dual_clipped = (advantages < 0) & (loss > cap)
        loss = jnp.where(dual_clipped, cap, loss)
        is_clipped = is_clipped | dual_clipped
    return loss, is_clipped.astype(jnp.float32)
