"""The per-role losses: the RL loss and the supervised (SFT) loss.

    RL:   loss = agg(clip_loss) + kl_coef * agg(k(logp, logp_ref)) - entropy_coef * agg(entropy)
    SFT:  loss = token_mean(-logp) over the masked tokens (`nll_loss`); a simulator's data anchor adds
          data_coef * that NLL on user data to its RL loss.

`agg` is one of the registered aggregations. Every aggregation is linear in the per-token values, so it
equals sum(values * w) with weights w = d agg / d values that depend only on the masks. The train step
computes w once on the full batch and sums `values * w` over micro-batches: gradient accumulation then
gives exactly the full-batch gradient for every aggregation mode.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from scope_jax.algorithms import AGGREGATIONS, KL_ESTIMATORS, clipped_policy_loss
from scope_jax.logprobs import token_logprobs
from scope_jax.training.batch import RoleBatch, TokenBatch


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Loss settings of one role.

    epsilon_low / epsilon_high: ratio clip range [1 - low, 1 + high] (high > low is clip-higher).
    dual_clip: None, or c > 1 capping the loss of negative-advantage tokens at c * |A|.
    aggregation: "token_mean", "seq_mean_token_mean" or "seq_mean_token_sum_norm".
    kl_coef / kl_estimator: weight and estimator ("k1", "k2", "k3") of the KL to the frozen reference.
    entropy_coef: weight of the entropy bonus.
    temperature: the sampling temperature, so recomputed log-probs match the behaviour log-probs.
    chunk_size: sequence chunk of the output head (bounds the logits held in memory: the backward pass
      computes each chunk's again); None: the default of `logprobs.head_chunk` (one chunk's logits within
      `logprobs.logits_bytes()`), with the logits kept for the backward pass when `logprobs.keeps_logits`.
    allowed_tokens: None, or the token ids the role samples from under constrained decoding; log-probs,
      entropies and KL are then taken under the softmax restricted to them, as the sampler drew.
    data_coef: weight of the data anchor, the NLL of the role's tokens in `Batch.sim_data` (simulators).
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = None
    aggregation: str = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    temperature: float = 1.0
    chunk_size: int | None = None
    allowed_tokens: tuple[int, ...] | None = None
    data_coef: float = 0.0


def aggregation_weights(mask: jax.Array, aggregation: str) -> jax.Array:
    """w with agg(values, mask) == sum(values * w) for every `values` (agg is linear in values)."""
    agg = AGGREGATIONS[aggregation]
    return jax.grad(lambda values: agg(values, mask))(jnp.zeros(mask.shape, jnp.float32))


def role_loss(graphdef: nnx.GraphDef, params, ref_params, batch: RoleBatch, weights: jax.Array,
              token_weights: jax.Array, config: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Loss of one role on `batch` [N, L].

    `weights` [N, L] come from `aggregation_weights(mask, config.aggregation)` and weight the loss;
    `token_weights` from `aggregation_weights(mask, "token_mean")` weight the metrics, so each metric's
    total over micro-batches is its mean over the role's tokens (entropy, clip fraction, ratio, KL).
    """
    # the reference runs the policy's head path: their log-probs of equal weights differ by round-off at most
    entropy_gradient = bool(config.entropy_coef)
    stats = token_logprobs(graphdef, params, batch.tokens, batch.positions, chunk_size=config.chunk_size,
                           temperature=config.temperature, allowed=config.allowed_tokens,
                           entropy_gradient=entropy_gradient)
    mask = batch.loss_mask.astype(jnp.float32)
    logp = jnp.where(mask > 0, stats.logprobs, 0.0)
    per_token, clipped = clipped_policy_loss(logp, batch.old_logprobs * mask, batch.advantages,
                                             epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high,
                                             dual_clip=config.dual_clip)
    weighted = lambda values: jnp.sum(values * weights)
    token_mean = lambda values: jnp.sum(jax.lax.stop_gradient(values) * token_weights)
    loss = weighted(per_token)
    metrics = {
        "pg_loss": loss,
        "entropy": token_mean(stats.entropy),
        "clip_fraction": token_mean(clipped),
        "ratio": token_mean(jnp.exp(logp - batch.old_logprobs * mask)),
    }
    if config.kl_coef:
        ref = token_logprobs(graphdef, jax.lax.stop_gradient(ref_params), batch.tokens, batch.positions,
                             chunk_size=config.chunk_size, temperature=config.temperature,
                             allowed=config.allowed_tokens, entropy_gradient=entropy_gradient).logprobs
        kl = KL_ESTIMATORS[config.kl_estimator](logp, jnp.where(mask > 0, ref, 0.0))
        loss = loss + config.kl_coef * weighted(kl)
        metrics["kl"] = token_mean(kl)
    if config.entropy_coef:
        loss = loss - config.entropy_coef * weighted(stats.entropy)
    return loss, metrics


def nll_loss(graphdef: nnx.GraphDef, params, batch: TokenBatch, weights: jax.Array,
             config: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked next-token NLL of `batch` [N, L]: sum(-log p(token) * weights), with `weights` from
    `aggregation_weights(batch.loss_mask, "token_mean")` on the full batch (so micro-batches add up to the
    full batch's token mean). Log-probs are taken at `config.temperature` and over `allowed_tokens`."""
    stats = token_logprobs(graphdef, params, batch.tokens, batch.positions, chunk_size=config.chunk_size,
                           temperature=config.temperature, allowed=config.allowed_tokens,
                           entropy_gradient=False)
    nll = jnp.sum(jnp.where(batch.loss_mask > 0, -stats.logprobs, 0.0) * weights)
    return nll, {"nll": jax.lax.stop_gradient(nll)}
