"""Log-probabilities and entropies of given tokens, for training.

Everything is aligned with the token ids: `logprobs[b, t] = log p(tokens[b, t] | tokens[b, :t])` and
`entropy[b, t]` is the entropy of that predictive distribution; position 0 (no prefix) holds 0. A loss
mask over tokens therefore selects exactly the tokens a role sampled. With `allowed` token ids (a role
that samples under constrained decoding), p is the softmax restricted to them, the distribution the
tokens were drawn from; other tokens get log-prob about -1e9, so mask them out.

The output head runs over sequence chunks, so no pass over the logits takes more than one chunk's
(batch x chunk x vocab). `head_stats` writes the backward pass out: it takes d/d logits in closed form from
the saved max, log-sum-exp and entropy, and from the chunk's logits, which the forward pass keeps when all
chunks' float32 logits together fit in `LOGITS_BYTES` (`keeps_logits`) and which are otherwise computed
again. By default a chunk's float32 logits fit in `logits_bytes()`: on an accelerator a small batch is one
chunk; on XLA:CPU a chunk's logits are at most 64 MiB, where the head's passes over them run faster than
over one large array. An explicit chunk size bounds the memory instead: the logits are then never kept.
When the entropy is a metric rather than a loss term (`entropy_gradient=False`) and the head weight is
frozen (a LoRA base), the forward pass already computes each log-prob's gradient with respect to the
hidden state, so the backward pass runs no matmul.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx
from jax.custom_derivatives import SymbolicZero

from scope_jax.models import cpu_gemm
from scope_jax.models.decoder import Params, bind, weight_grad
from scope_jax.models.layouts import residuals_as_bits, residuals_from_bits, xla_cpu_layouts


LOGITS_BYTES = 512 * 2**20  # no chunk size given: a chunk's float32 logits at most; all chunks' when kept
CPU_LOGITS_BYTES = 64 * 2**20  # the same on XLA:CPU (docs/models.md)
VOCAB_SUM_ROWS = 16  # the vocabulary's rows summed down on XLA:CPU (`vocab_sums`)


class TokenStats(NamedTuple):
    logprobs: jax.Array  # [B, L] float32
    entropy: jax.Array  # [B, L] float32


def _logits(hidden: jax.Array, weight: jax.Array, temperature: float, allowed: jax.Array | None,
            vocab_major: bool) -> jax.Array:
    """Float32 hidden @ weight / temperature (weight [d, V], or [V, d] when vocab_major); -1e9 outside
    `allowed` (bool [V]): finite, since 0 * -inf would be nan in the entropy."""
    logits = cpu_gemm.dense(hidden, weight.astype(hidden.dtype), transpose_kernel=vocab_major,
                            preferred_element_type=jnp.float32)
    logits = logits / temperature
    return logits if allowed is None else jnp.where(allowed, logits, -1e9)


def _softmax_stats(logits: jax.Array,
                   targets: jax.Array) -> tuple[TokenStats, jax.Array, jax.Array, jax.Array]:
    """(log p(target) and entropy, max logit, log-sum-exp of the logits less their max, probabilities) of
    softmax(logits). Log-probs are taken from the logits less their max, exactly 0 at the max, so a
    near-certain token's log p and the entropy keep their relative precision."""
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    shifted = logits - top
    unnormalized = jnp.exp(shifted)
    is_target = jnp.arange(logits.shape[-1]) == targets[..., None]
    total, target_shifted, weighted = vocab_sums(
        (unnormalized, jnp.where(is_target, shifted, 0.0), unnormalized * shifted))
    log_total = jnp.log(total)
    stats = TokenStats(target_shifted - log_total, log_total - weighted / total)
    return stats, top[..., 0], log_total, unnormalized / total[..., None]


def vocab_sums(terms: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """Each [..., vocab] term summed over its last axis. On XLA:CPU all terms go through one variadic
    reduce, each laid out as [VOCAB_SUM_ROWS, vocab / VOCAB_SUM_ROWS] and summed down the rows (adding
    contiguous vectors), then across: a plain sum of exp(logits) goes to YNNPACK, whose exp-and-sum
    runs several times slower than XLA's own loop."""
    if not xla_cpu_layouts():
        return tuple(jnp.sum(term, axis=-1) for term in terms)
    vocab = terms[0].shape[-1]
    rows = math.gcd(vocab, VOCAB_SUM_ROWS)
    laid_out = tuple(term.reshape(*term.shape[:-1], rows, vocab // rows) for term in terms)
    zeros = tuple(jnp.zeros((), term.dtype) for term in terms)
    row_sums = jax.lax.reduce(laid_out, zeros, lambda a, b: tuple(map(operator.add, a, b)),
                              (laid_out[0].ndim - 2,))
    return tuple(jnp.sum(sums, axis=-1) for sums in row_sums)


def head_weight_grad(inputs: jax.Array, grad: jax.Array, vocab_major: bool = False) -> jax.Array:
    """sum over tokens of inputs^T grad, [d, vocab] ([vocab, d] when vocab_major): the output head weight's
    gradient, in float32 on XLA:CPU by `cpu_gemm` (`decoder.weight_grad`), which writes either layout
    directly. Otherwise on XLA:CPU the small operand (tokens x d) is transposed and the product kept
    [d, vocab], both behind barriers: left to itself XLA transposes `grad` (tokens x vocab) or the product
    and multiplies on a slower path."""
    if cpu_gemm.uses_mkl(inputs, grad):
        return weight_grad(grad, inputs) if vocab_major else weight_grad(inputs, grad)
    tokens = lambda a: a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
    if not xla_cpu_layouts():
        product = tokens(inputs).T @ tokens(grad)
    else:
        barrier = jax.lax.optimization_barrier
        product = barrier(barrier(tokens(inputs).T) @ tokens(grad))
    return product.T if vocab_major else product


def _allowed_mask(allowed: tuple[int, ...] | None, vocab: int) -> jax.Array | None:
    return None if allowed is None else jnp.zeros(vocab, bool).at[jnp.asarray(allowed)].set(True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def head_stats(hidden: jax.Array, weight: jax.Array, targets: jax.Array, temperature: float = 1.0,
               allowed: tuple[int, ...] | None = None, entropy_gradient: bool = True,
               keep_logits: bool = False, vocab_major: bool = False) -> TokenStats:
    """log p(target) and entropy of softmax(hidden @ weight / temperature), in float32; with `allowed`
    (token ids) the softmax is restricted to them. The weight is [d, vocab], or [vocab, d] with
    vocab_major (a tied embedding as stored: the matmuls take it without a transposed copy).

    The backward pass is written out: it takes d/d logits in closed form from the saved max, log-sum-exp
    and entropy, and from the logits, kept from the forward pass (keep_logits) or else computed again by a
    second logits matmul. With entropy_gradient=False the entropy is a metric (differentiating it raises),
    and with the weight frozen too the forward pass keeps d log p(target) / d hidden instead, so the
    backward pass runs no matmul and keeps no logits.
    """
    mask = _allowed_mask(allowed, _vocab(weight, vocab_major))
    return _softmax_stats(_logits(hidden, weight, temperature, mask, vocab_major), targets)[0]


def _vocab(weight: jax.Array, vocab_major: bool) -> int:
    return weight.shape[0 if vocab_major else -1]


@residuals_as_bits
def _head_stats_forward(hidden, weight, targets, temperature, allowed, entropy_gradient, keep_logits,
                        vocab_major):
    h, w, t = hidden.value, weight.value, targets.value
    mask = _allowed_mask(allowed, _vocab(w, vocab_major))
    logits = _logits(h, w, temperature, mask, vocab_major)
    stats, top, log_total, probs = _softmax_stats(logits, t)
    if weight.perturbed or entropy_gradient:
        return stats, (h, w, t, top, log_total, stats.entropy, h if weight.perturbed else None, None,
                       logits if keep_logits else None)
    # d log p(t) / d logits = onehot(t) - probs (0 outside `allowed`); d logits / d h = W^T / temperature
    token_rows = w if vocab_major else w.T
    target_rows = token_rows[t].astype(jnp.float32) * (1.0 if mask is None else mask[t][..., None])
    expected_row = cpu_gemm.dense(probs.astype(h.dtype), w.astype(h.dtype), transpose_kernel=not vocab_major,
                                  preferred_element_type=jnp.float32)
    d_hidden = ((target_rows - expected_row) / temperature).astype(h.dtype)
    return stats, (None, None, None, None, None, None, None, d_hidden, None)


@residuals_from_bits
def _head_stats_backward(temperature, allowed, entropy_gradient, keep_logits, vocab_major, residuals,
                         grad: TokenStats):
    if not entropy_gradient and not isinstance(grad.entropy, SymbolicZero):
        raise ValueError("this entropy is a metric: token_logprobs(..., entropy_gradient=True) "
                         "differentiates it")
    h, w, t, top, log_total, entropy, weight_inputs, d_hidden, logits = residuals
    zero = lambda g: None if isinstance(g, SymbolicZero) else g
    d_logprobs, d_entropy = zero(grad.logprobs), zero(grad.entropy)
    if d_logprobs is None and d_entropy is None:
        return None, None, None
    if d_hidden is not None:
        return (d_logprobs[..., None] * d_hidden).astype(d_hidden.dtype), None, None
    vocab = _vocab(w, vocab_major)
    mask = _allowed_mask(allowed, vocab)
    if logits is None:
        logits = _logits(h, w, temperature, mask, vocab_major)
    logprobs = (logits - top[..., None]) - log_total[..., None]
    probs = jnp.exp(logprobs)
    # d log p(t) / d logits = onehot(t) - p;  d entropy / d logits = -p (log p + entropy)
    terms = []
    if d_logprobs is not None:
        terms.append(d_logprobs[..., None] * (jax.nn.one_hot(t, vocab, dtype=probs.dtype) - probs))
    if d_entropy is not None:
        terms.append(-d_entropy[..., None] * probs * (logprobs + entropy[..., None]))
    d_logits = functools.reduce(operator.add, terms)
    if mask is not None:  # outside `allowed` the logits are a constant
        d_logits = jnp.where(mask, d_logits, 0.0)
    d_logits = (d_logits / temperature).astype(h.dtype)
    d_h = cpu_gemm.dense(d_logits, w.astype(h.dtype), transpose_kernel=not vocab_major,
                         preferred_element_type=jnp.float32)
    d_w = (None if weight_inputs is None
           else head_weight_grad(weight_inputs, d_logits, vocab_major).astype(w.dtype))
    return d_h.astype(h.dtype), d_w, None


head_stats.defvjp(_head_stats_forward, _head_stats_backward, symbolic_zeros=True)


def logits_bytes() -> int:
    """The float32 logits of one default head chunk at most: CPU_LOGITS_BYTES on XLA:CPU, else
    LOGITS_BYTES."""
    return CPU_LOGITS_BYTES if xla_cpu_layouts() else LOGITS_BYTES


def _float32_logits_bytes(batch: int, positions: int, vocab: int) -> int:
    return batch * positions * vocab * 4


def keeps_logits(batch: int, positions: int, vocab: int) -> bool:
    """Whether the head's forward pass keeps the logits for the backward pass when no chunk size is given:
    when all of them, float32 (batch x positions x vocab), fit in LOGITS_BYTES, on every backend."""
    return _float32_logits_bytes(batch, positions, vocab) <= LOGITS_BYTES


def head_chunk(batch: int, positions: int, vocab: int) -> int:
    """The default sequence chunk of the output head: the fewest equal chunks of `positions` whose float32
    logits (batch x chunk x vocab) each fit in `logits_bytes()`."""
    chunks = -(-_float32_logits_bytes(batch, positions, vocab) // logits_bytes())
    return max(1, -(-positions // chunks))


def token_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, positions: jax.Array, *,
                   chunk_size: int | None = None, temperature: float = 1.0,
                   allowed: tuple[int, ...] | None = None, entropy_gradient: bool = True) -> TokenStats:
    """Per-token log-probs and entropies of `tokens` [B, L] under the model (see module docstring);
    chunk_size: the head's sequence chunk (None: `head_chunk`, and the logits kept for the backward pass
    when `keeps_logits`); with entropy_gradient=False the entropy is a metric (`head_stats`)."""
    chex.assert_rank([tokens, positions], 2)
    model = bind(graphdef, params)
    hidden, _ = model.hidden(tokens, positions)
    weight, vocab_major = model.head_weight_as_stored()
    vocab = _vocab(weight, vocab_major)
    batch, length, dim = hidden.shape
    # Hidden state t predicts token t + 1.
    hidden, targets = hidden[:, :-1], tokens[:, 1:]
    chunk = min(chunk_size or head_chunk(batch, length - 1, vocab), length - 1)
    padded = -(-(length - 1) // chunk) * chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, padded - (length - 1)), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, padded - (length - 1))))
    hidden = hidden.reshape(batch, padded // chunk, chunk, dim).swapaxes(0, 1)
    targets = targets.reshape(batch, padded // chunk, chunk).swapaxes(0, 1)

    keep = chunk_size is None and keeps_logits(batch, padded, vocab)
    stats = jax.lax.map(lambda ht: head_stats(ht[0], weight, ht[1], temperature, allowed, entropy_gradient,
                                              keep, vocab_major), (hidden, targets))
    unchunk = lambda x: jnp.pad(x.swapaxes(0, 1).reshape(batch, padded)[:, :length - 1], ((0, 0), (1, 0)))
    return TokenStats(*map(unchunk, stats))
