"""Attention with per-row positions: one tile for small score matrices, blockwise (online softmax) for large.

Layout: queries q [N, H, Q, d] with H the key/value heads (the query heads that share a kv head are folded
into Q), keys and values [N, H, S, d], query positions [N, Q] and key positions [N, S]. Key s is visible
to query t iff key_positions[s] <= query_positions[t]; a query that sees no key gets 0.

When one (row, head) score matrix Q x S holds more than `block` x `block` entries, the keys are taken
`block` at a time and the queries `block` at a time, with the running max and sum of the FlashAttention
recurrence, and tiles that no query of the chunk can see are skipped; a smaller matrix is one tile. The
backward pass (a custom VJP) recomputes each tile's probabilities from the saved log-sum-exp instead of
storing them, so a blockwise attention never holds anything of size Q x S, and a layer's saved
activations hold no score matrix either way.

On XLA:CPU a single tile of the differentiable `attention` runs over the batch rows in groups whose scores
fit `ROW_GROUP_BYTES`, so that each group's scores and probabilities stay in cache between the ops that
read them; elsewhere one tile takes every row (docs/models.md, layout tricks).

With `groups`, the queries of each kv head are `groups` query heads of L positions each, folded head-major
into Q (`fold_queries`), and the output comes back token-major, [N, L, H * groups * d], the layout the output
projection reads; the backward pass then keeps that output, the very array the projection keeps, so a layer
saves the attention output once.

`accumulate` exposes the recurrence itself, so one set of queries can attend over several key segments
in turn (a shared prompt prefix, then a row's own cache) with the exact result of one softmax over all.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from scope_jax.models import cpu_attention
from scope_jax.models.layouts import residuals_as_bits, residuals_from_bits, xla_cpu_layouts

BLOCK = 512
ROW_GROUP_BYTES = 4 * 2**20  # float32 scores of one row group of a single tile, on XLA:CPU
FEW_QUERIES = 16  # at most this many queries per (row, kv head): scores keys-major on XLA:CPU
_HIDDEN = jnp.finfo(jnp.float32).min  # the score of an invisible key
_NO_QUERY = jnp.iinfo(jnp.int32).min  # position of a padding query: sees nothing
_NO_KEY = jnp.iinfo(jnp.int32).max  # position of a padding key: seen by nothing


class Partial(NamedTuple):
    """Online-softmax state of queries [N, H, Q], float32: the largest visible score so far, the sum of
    exp(score - max) over visible keys, and the exp(score - max)-weighted sum of their values [N, H, Q, d]."""

    max: jax.Array
    sum: jax.Array
    out: jax.Array

    @classmethod
    def empty(cls, q: jax.Array) -> "Partial":
        shape = q.shape[:-1]
        return cls(jnp.full(shape, _HIDDEN), jnp.zeros(shape), jnp.zeros(q.shape, jnp.float32))


def _scores(q, k, q_pos, k_pos):
    """Float32 scores [N, H, Q, S] and their visibility [N, 1, Q, S]."""
    k = k.astype(q.dtype)
    if q.shape[2] <= FEW_QUERIES and xla_cpu_layouts():
        # A decode step's few queries: XLA:CPU runs the keys-major product several times faster; the
        # barrier keeps XLA from folding the (small) transpose back into the matmul.
        scores = jnp.einsum("nhsd,nhqd->nhsq", k, q, preferred_element_type=jnp.float32)
        scores = jax.lax.optimization_barrier(scores).swapaxes(2, 3)
    else:
        scores = jnp.einsum("nhqd,nhsd->nhqs", q, k, preferred_element_type=jnp.float32)
    return scores / math.sqrt(q.shape[-1]), k_pos[:, None, None, :] <= q_pos[:, None, :, None]


def _update(partial: Partial, q, k, v, q_pos, k_pos) -> Partial:
    """`partial` after the queries also attend over keys k, values v (one tile)."""
    scores, visible = _scores(q, k, q_pos, k_pos)
    scores = jnp.where(visible, scores, _HIDDEN)
    new_max = jnp.maximum(partial.max, scores.max(-1))
    probs = jnp.where(visible, jnp.exp(scores - new_max[..., None]), 0.0)
    rescale = jnp.exp(partial.max - new_max)
    values = jnp.einsum("nhqs,nhsd->nhqd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return Partial(new_max, partial.sum * rescale + probs.sum(-1), partial.out * rescale[..., None] + values)


def _small(q_len: int, k_len: int, block: int) -> bool:
    return q_len * k_len <= block * block


def _chunks(x: jax.Array, axis: int, size: int, fill) -> jax.Array:
    """x with `axis` padded (by `fill`) to a multiple of `size` and cut into chunks: [chunks, ...]."""
    length = x.shape[axis]
    padded = -(-length // size) * size
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, padded - length)
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape(x.shape[:axis] + (padded // size, size) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _unchunk(x: jax.Array, axis: int, length: int) -> jax.Array:
    """The inverse of `_chunks` (chunk axis first, chunk contents at `axis`)."""
    x = jnp.moveaxis(x, 0, axis)
    x = x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def _sees(q_pos_chunk: jax.Array, k_pos_block: jax.Array) -> jax.Array:
    """Whether any query of the chunk [N, q] sees any key of the block [N, k]."""
    return jnp.any(k_pos_block.min(-1) <= q_pos_chunk.max(-1))


def accumulate(partial: Partial, q, k, v, q_pos, k_pos, block: int = BLOCK) -> Partial:
    """`partial` (of queries q [N, H, Q, d] at q_pos [N, Q]) after attending over k, v [N, H, S, d] at
    k_pos [N, S]: in one tile when Q x S <= block^2, else block by block (not differentiable: see
    `attention`)."""
    q_len, k_len = q.shape[2], k.shape[2]
    if _small(q_len, k_len, block):
        return _update(partial, q, k, v, q_pos, k_pos)
    keys = (_chunks(k, 2, block, 0), _chunks(v, 2, block, 0), _chunks(k_pos, 1, block, _NO_KEY))

    def chunk(args):
        chunk_partial, q_chunk, q_pos_chunk = args

        def tile(state, key_block):
            k_block, v_block, k_pos_block = key_block
            state = jax.lax.cond(_sees(q_pos_chunk, k_pos_block),
                                 lambda: _update(state, q_chunk, k_block, v_block, q_pos_chunk, k_pos_block),
                                 lambda: state)
            return state, None

        return jax.lax.scan(tile, Partial(*chunk_partial), keys)[0]

    chunked = jax.lax.map(chunk, (Partial(*(_chunks(x, 2, block, 0) for x in partial)),
                                  _chunks(q, 2, block, 0), _chunks(q_pos, 1, block, _NO_QUERY)))
    return Partial(*(_unchunk(x, 2, q_len) for x in chunked))


def shared_prefix(q, k, v, lengths, block: int = BLOCK) -> Partial:
    """The partial of queries q [N, H, Q, d] (N = G groups of R consecutive rows) over their group's shared
    keys k, v [G, H, S, d], row n seeing the first lengths[n] of them (all before its own positions).

    The rows of a group are folded into the query axis, so a group's keys are read once for all its rows.
    """
    groups, (rows, heads, q_len, _) = k.shape[0], q.shape
    per_group = rows // groups
    fold = lambda x: x.reshape(groups, per_group, heads, q_len, *x.shape[3:]).swapaxes(1, 2).reshape(
        groups, heads, per_group * q_len, *x.shape[3:])
    q_pos = jnp.broadcast_to((lengths - 1)[:, None], (rows, q_len)).reshape(groups, per_group * q_len)
    k_pos = jnp.broadcast_to(jnp.arange(k.shape[2], dtype=jnp.int32), (groups, k.shape[2]))
    folded = fold(q)
    partial = accumulate(Partial.empty(folded), folded, k, v, q_pos, k_pos, block)
    unfold = lambda x: x.reshape(groups, heads, per_group, q_len, *x.shape[3:]).swapaxes(1, 2).reshape(
        rows, heads, q_len, *x.shape[3:])
    return Partial(*map(unfold, partial))


def scores_bytes(q_len: int, k_len: int, kv_heads: int, groups: int, block: int = BLOCK) -> int:
    """Bytes of float32 scores one row's attention holds at once in one layer, for q_len queries (per query
    head) over k_len keys: the whole kv_heads x (groups q_len) x k_len matrix when it is small, else one
    block x block tile per kv head (the probabilities take as much again)."""
    queries = groups * q_len
    if _small(queries, k_len, block):
        return 4 * kv_heads * queries * k_len
    return 4 * kv_heads * min(queries, block) * min(k_len, block)


def normalize(partial: Partial, dtype) -> jax.Array:
    """The attention output [N, H, Q, d] of a finished `partial` (0 for queries that saw nothing)."""
    return (partial.out / jnp.where(partial.sum == 0, 1.0, partial.sum)[..., None]).astype(dtype)


def row_group(rows: int, row_bytes: int) -> int:
    """The batch rows a single tile takes at once: all of them, except on XLA:CPU, where it is the largest
    divisor of `rows` whose scores (row_bytes a row) fit ROW_GROUP_BYTES, and at least one row."""
    if not xla_cpu_layouts():
        return rows
    fits = max(1, ROW_GROUP_BYTES // row_bytes)
    return max(d for d in range(1, min(rows, fits) + 1) if rows % d == 0)


def _in_row_groups(fn, q, k, *rest):
    """fn(q, k, *rest) of arrays with the batch rows first, taken `row_group` rows at a time."""
    rows, heads, q_len, _ = q.shape
    group = row_group(rows, 4 * heads * q_len * k.shape[2])
    if group == rows:
        return fn(q, k, *rest)
    split = lambda x: x.reshape(rows // group, group, *x.shape[1:])
    out = jax.lax.map(lambda args: fn(*args), tuple(map(split, (q, k, *rest))))
    return jax.tree.map(lambda x: x.reshape(rows, *x.shape[2:]), out)


def _finished(q, k, v, q_pos, k_pos, block) -> Partial:
    """The partial of queries q over all of k, v: one tile (in row groups) or blockwise."""
    if _small(q.shape[2], k.shape[2], block):
        return _in_row_groups(lambda *tile: _update(Partial.empty(tile[0]), *tile), q, k, v, q_pos, k_pos)
    return accumulate(Partial.empty(q), q, k, v, q_pos, k_pos, block)


def unfold_queries(x: jax.Array, groups: int | None) -> jax.Array:
    """[N, H, groups * L, e], each kv head's `groups` query heads one after another, as token-major [N, L,
    H * groups * e] (query head h is kv head h // groups); unchanged when groups is None."""
    if groups is None:
        return x
    n, heads, queries, e = x.shape
    length = queries // groups
    return x.reshape(n, heads, groups, length, e).transpose(0, 3, 1, 2, 4).reshape(n, length, -1)


def fold_queries(x: jax.Array, heads: int, groups: int | None) -> jax.Array:
    """The inverse of `unfold_queries`: token-major [N, L, heads * groups * e] as [N, heads, groups * L,
    e]."""
    if groups is None:
        return x
    n, length, features = x.shape
    e = features // (heads * groups)
    x = x.reshape(n, length, heads, groups, e).transpose(0, 2, 3, 1, 4)
    return x.reshape(n, heads, groups * length, e)


def attention(q, k, v, q_pos, k_pos, block: int = BLOCK, groups: int | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(d), over visible keys) v: one tile or blockwise (module docstring); [N, H, Q,
    d], or with `groups` token-major [N, Q / groups, H * groups * d]."""
    return _attention(q, k, v, q_pos, k_pos, block, groups)


def _out_and_lse(q, k, v, q_pos, k_pos, block) -> tuple[jax.Array, jax.Array]:
    """The output [N, H, Q, d] in v's dtype and the log-sum-exp of each query's visible scores [N, H, Q]
    (+inf when it sees nothing, so that exp(s - lse) = 0): MKL's kernel where it runs, else XLA's one
    tile or blockwise."""
    if cpu_attention.uses_kernel(q, k, v):
        out, lse = cpu_attention.forward(q, k, v, q_pos, k_pos)
        return out.astype(v.dtype), lse
    partial = _finished(q, k, v, q_pos, k_pos, block)
    lse = jnp.where(partial.sum > 0, partial.max + jnp.log(jnp.where(partial.sum > 0, partial.sum, 1.0)),
                    jnp.inf)
    return normalize(partial, v.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, q_pos, k_pos, block, groups):
    return unfold_queries(_out_and_lse(q, k, v, q_pos, k_pos, block)[0], groups)


@residuals_as_bits
def _attention_forward(q, k, v, q_pos, k_pos, block, groups):
    out, lse = _out_and_lse(q, k, v, q_pos, k_pos, block)
    out = unfold_queries(out, groups)
    return out, (q, k, v, q_pos, k_pos, out, lse)


def _tile_gradients(q, k, v, grad, lse, delta, q_pos, k_pos):
    """(dq, dk, dv) in float32 of one tile: queries q [N, H, Q, d] with their output gradient `grad`,
    log-sum-exp and delta = sum(grad * out) [N, H, Q]; keys k and values v [N, H, S, d]. The matmuls take
    q's dtype and accumulate in float32, as the forward pass's do."""
    dot = lambda spec, a, b: jnp.einsum(spec, a.astype(q.dtype), b.astype(q.dtype),
                                        preferred_element_type=jnp.float32)
    scores, visible = _scores(q, k, q_pos, k_pos)
    probs = jnp.where(visible, jnp.exp(scores - lse[..., None]), 0.0)
    d_probs = dot("nhqd,nhsd->nhqs", grad, v)
    d_scores = probs * (d_probs - delta[..., None]) / math.sqrt(q.shape[-1])
    return (dot("nhqs,nhsd->nhqd", d_scores, k), dot("nhqs,nhqd->nhsd", d_scores, q),
            dot("nhqs,nhqd->nhsd", probs, grad))


def _delta(grad: jax.Array, out: jax.Array, heads: int, groups: int | None, dim: int) -> jax.Array:
    """sum(grad * out) over each query's `dim` features, [N, H, Q]: summed in the output's own layout, then
    (a tiny array) folded."""
    products = grad.astype(jnp.float32) * out.astype(jnp.float32)
    per_query = jnp.sum(products.reshape(*products.shape[:-1], -1, dim), axis=-1)  # [..., 1] when not grouped
    return fold_queries(per_query, heads, groups)[..., 0]


@residuals_from_bits
def _attention_backward(block, groups, residuals, grad):
    """One tile (in row groups) when the forward pass was one; else key blocks outside, query chunks
    inside: dk, dv of a block accumulate over the query chunks, dq over the key blocks. Each tile's
    probabilities are recomputed from the log-sum-exp."""
    q, k, v, q_pos, k_pos, out, lse = residuals
    delta = _delta(grad, out, q.shape[1], groups, q.shape[-1])  # [N, H, Q]
    grad = fold_queries(grad, q.shape[1], groups)
    q_len, k_len = q.shape[2], k.shape[2]
    if cpu_attention.uses_kernel(q, k, v):
        dq, dk, dv = cpu_attention.backward(q, k, v, q_pos, k_pos, grad, lse, delta)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None
    if _small(q_len, k_len, block):
        dq, dk, dv = _in_row_groups(_tile_gradients, q, k, v, grad, lse, delta, q_pos, k_pos)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None
    queries = (_chunks(q, 2, block, 0), _chunks(grad, 2, block, 0), _chunks(lse, 2, block, jnp.inf),
               _chunks(delta, 2, block, 0), _chunks(q_pos, 1, block, _NO_QUERY))
    keys = (_chunks(k, 2, block, 0), _chunks(v, 2, block, 0), _chunks(k_pos, 1, block, _NO_KEY))

    def key_block(dq, key):
        k_block, v_block, k_pos_block = key

        def query_chunk(dkv, query):
            q_chunk, g_chunk, lse_chunk, delta_chunk, q_pos_chunk = query

            def tile():
                dq_tile, dk, dv = _tile_gradients(q_chunk, k_block, v_block, g_chunk, lse_chunk, delta_chunk,
                                                  q_pos_chunk, k_pos_block)
                return (dkv[0] + dk, dkv[1] + dv), dq_tile

            return jax.lax.cond(_sees(q_pos_chunk, k_pos_block), tile,
                                lambda: (dkv, jnp.zeros(q_chunk.shape, jnp.float32)))

        zeros = jnp.zeros(k_block.shape, jnp.float32)
        (dk, dv), dq_parts = jax.lax.scan(query_chunk, (zeros, zeros), queries)
        return dq + dq_parts, (dk, dv)

    dq = jnp.zeros(queries[0].shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(key_block, dq, keys)
    return (_unchunk(dq, 2, q_len).astype(q.dtype), _unchunk(dk, 2, k_len).astype(k.dtype),
            _unchunk(dv, 2, k_len).astype(v.dtype), None, None)


_attention.defvjp(_attention_forward, _attention_backward)
