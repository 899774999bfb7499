"""Log-probabilities and entropies of given tokens, for training.

Everything is aligned with the token ids: `logprobs[b, t] = log p(tokens[b, t] | tokens[b, :t])` and
`entropy[b, t]` is the entropy of that predictive distribution; position 0 (no prefix) holds 0. A loss
mask over tokens therefore selects exactly the tokens a role sampled. With `allowed` token ids (a role
that samples under constrained decoding), p is the softmax restricted to them, the distribution the
tokens were drawn from; other tokens get log-prob about -1e9, so mask them out.

The output head runs over sequence chunks under `jax.checkpoint`, so neither the forward nor the
backward pass ever holds the full (batch x length x vocab) logits: only one chunk's.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from scope_jax.models.decoder import Params, bind


class TokenStats(NamedTuple):
    logprobs: jax.Array  # [B, L] float32
    entropy: jax.Array  # [B, L] float32


def head_stats(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
               temperature: float = 1.0, allowed: jax.Array | None = None) -> TokenStats:
    """log p(target) and entropy of softmax(hidden @ weight / temperature), in float32; with `allowed`
    (bool [V]) the softmax is restricted to the allowed tokens."""
    logits = jnp.einsum("...d,dv->...v", hidden, weight.astype(hidden.dtype),
                        preferred_element_type=jnp.float32) / temperature
    if allowed is not None:
        logits = jnp.where(allowed, logits, -1e9)  # finite: 0 * -inf would be nan in the entropy
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    entropy = lse - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
    return TokenStats(target_logits - lse, entropy)


def token_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, positions: jax.Array, *,
                   chunk_size: int = 128, temperature: float = 1.0,
                   allowed: tuple[int, ...] | None = None) -> TokenStats:
    """Per-token log-probs and entropies of `tokens` [B, L] under the model (see module docstring)."""
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

    mask = None if allowed is None else jnp.zeros(weight.shape[-1], bool).at[jnp.asarray(allowed)].set(True)
    per_chunk = jax.checkpoint(lambda h, t: head_stats(h, weight, t, temperature, mask))
    stats = jax.lax.map(lambda ht: per_chunk(*ht), (hidden, targets))
    unchunk = lambda x: jnp.pad(x.swapaxes(0, 1).reshape(batch, padded)[:, :length - 1], ((0, 0), (1, 0)))
    return TokenStats(*map(unchunk, stats))
