"""One-tile and blockwise attention against a float64 numpy softmax, their gradients against autodiff of a
plain jnp softmax, shared-prefix attention against attention over the concatenated keys, what the backward
pass keeps, and the memory of the blockwise path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import attention
from tests.jaxprs import equations

N, H, D = 3, 2, 8


def reference(q, k, v, q_pos, k_pos):
    """float64 softmax(q k^T / sqrt(d)) v over visible keys (k_pos <= q_pos); 0 where nothing is visible."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("nhqd,nhsd->nhqs", q, k) / np.sqrt(q.shape[-1])
    visible = np.asarray(k_pos)[:, None, None, :] <= np.asarray(q_pos)[:, None, :, None]
    scores = np.where(visible, scores, -np.inf)
    top = np.max(scores, -1, keepdims=True)
    weights = np.where(visible, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    total = weights.sum(-1, keepdims=True)
    return np.einsum("nhqs,nhsd->nhqd", weights / np.where(total == 0, 1, total), v)


def plain(q, k, v, q_pos, k_pos):
    """The same in jnp, differentiable by autodiff (rows that see something)."""
    scores = jnp.einsum("nhqd,nhsd->nhqs", q, k) / np.sqrt(q.shape[-1])
    visible = k_pos[:, None, None, :] <= q_pos[:, None, :, None]
    return jnp.einsum("nhqs,nhsd->nhqd", jax.nn.softmax(jnp.where(visible, scores, -1e30), -1), v)


def case(q_len, k_len, seed=0):
    """Random q, k, v; rows with different offsets: keys at positions offset + s, queries at the last
    q_len of them (causal self-attention of a row's tail); row 2's keys are partly padding."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(N, H, n, D)).astype(np.float32) for n in (q_len, k_len, k_len))
    offsets = np.array([0, 5, 2])
    k_pos = offsets[:, None] + np.arange(k_len)[None]
    k_pos[2, k_len - 4:] = np.iinfo(np.int32).max  # padding keys
    q_pos = offsets[:, None] + (k_len - q_len) + np.arange(q_len)[None]
    return tuple(jnp.asarray(x) for x in (q, k, v, q_pos.astype(np.int32), k_pos.astype(np.int32)))


@pytest.mark.parametrize("block", [64, 4, 5], ids=["one-tile", "blockwise", "blockwise-ragged"])
def test_attention_matches_numpy(block):
    args = case(13, 21)
    out = jax.jit(attention.attention, static_argnums=5)(*args, block)
    np.testing.assert_allclose(np.asarray(out), reference(*args), atol=2e-6)


@pytest.mark.parametrize("block", [64, 4, 5], ids=["one-tile", "blockwise", "blockwise-ragged"])
def test_gradients_equal_autodiff_of_a_plain_softmax(block):
    q, k, v, q_pos, k_pos = case(13, 21, seed=1)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v, q_pos, k_pos) * weights)
    ours = jax.grad(loss(lambda *a: attention.attention(*a, block=block)), argnums=(0, 1, 2))
    ours = jax.jit(ours)(q, k, v)
    theirs = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)


MIB = 2**20


@pytest.mark.parametrize("rows, row_bytes, group", [(8, 2_400_000, 1), (8, MIB, 4), (8, 1_500_000, 2),
                                                    (6, MIB, 3), (7, MIB, 1), (3, 2**30, 1)])
def test_a_row_group_is_the_largest_divisor_of_the_rows_whose_scores_fit(monkeypatch, rows, row_bytes, group):
    """Hand-counted against the 4 MiB budget; on an accelerator one tile takes every row."""
    assert attention.ROW_GROUP_BYTES == 4 * MIB
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert attention.row_group(rows, row_bytes) == group
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert attention.row_group(rows, row_bytes) == rows


@pytest.mark.parametrize("backend, grouped", [("cpu", True), ("gpu", False)])
def test_one_tile_runs_row_by_row_on_the_cpu_only_with_the_same_values_and_gradients(monkeypatch, backend,
                                                                                    grouped):
    """With a budget below one row's scores the CPU takes the rows one at a time (a loop in the program,
    forward and backward) and the values and gradients stay those of the references above."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(attention, "ROW_GROUP_BYTES", 1)
    q, k, v, q_pos, k_pos = case(13, 21, seed=1)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v, q_pos, k_pos) * weights)
    ours = lambda q, k, v, q_pos, k_pos: attention.attention(q, k, v, q_pos, k_pos, 64)
    gradients = jax.grad(loss(ours), argnums=(0, 1, 2))
    program = jax.make_jaxpr(gradients)(q, k, v).jaxpr
    assert len([eqn for eqn in equations(program) if eqn.primitive.name == "scan"]) == (2 if grouped else 0)
    out = jax.jit(ours)(q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(np.asarray(out), reference(q, k, v, q_pos, k_pos), atol=2e-6)
    expected = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", jax.jit(gradients)(q, k, v), expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)


@pytest.mark.parametrize("block", [64, 4], ids=["one-tile", "blockwise"])
def test_shared_prefix_then_own_keys_equals_one_softmax_over_both(block):
    """Two groups of two rows: row n sees the first lengths[n] keys of its group's prefix, then its own."""
    rng = np.random.default_rng(3)
    prefix_len, own_len, q_len = 11, 9, 6
    lengths = np.array([11, 7, 0, 4], np.int32)
    shared_k, shared_v = (rng.normal(size=(2, H, prefix_len, D)).astype(np.float32) for _ in range(2))
    q = rng.normal(size=(4, H, q_len, D)).astype(np.float32)
    k, v = (rng.normal(size=(4, H, own_len, D)).astype(np.float32) for _ in range(2))
    k_pos = lengths[:, None] + np.arange(own_len)[None]
    q_pos = k_pos[:, -q_len:]

    @jax.jit
    def ours(q, shared_k, shared_v, k, v):
        partial = attention.shared_prefix(q, shared_k, shared_v, jnp.asarray(lengths), block)
        partial = attention.accumulate(partial, q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), block)
        return attention.normalize(partial, jnp.float32)

    # Reference: each row's visible prefix keys concatenated before its own keys.
    group = np.repeat([0, 1], 2)
    all_k = np.concatenate([shared_k[group], k], axis=2)
    all_v = np.concatenate([shared_v[group], v], axis=2)
    prefix_pos = np.where(np.arange(prefix_len)[None] < lengths[:, None], np.arange(prefix_len)[None],
                          np.iinfo(np.int32).max)
    expected = reference(q, all_k, all_v, q_pos, np.concatenate([prefix_pos, k_pos], axis=1))
    np.testing.assert_allclose(np.asarray(ours(q, shared_k, shared_v, k, v)), expected, atol=2e-6)


def test_the_backward_pass_keeps_no_score_matrix():
    """One tile (the dense case) too: the residuals are q, k, v, their positions, the output and one
    log-sum-exp per query, nothing of size Q x S."""
    q, k, v, q_pos, k_pos = case(13, 21)
    _, backward = jax.vjp(lambda q, k, v: attention.attention(q, k, v, q_pos, k_pos, 64), q, k, v)
    largest = max(x.size for x in jax.tree.leaves(backward))
    assert largest == max(q.size, k.size), [x.shape for x in jax.tree.leaves(backward)]


def test_blockwise_memory_is_linear_in_the_length():
    """Forward and backward: the dense program holds [N, H, Q, S] float32 scores (several times), the
    blockwise one nothing near one such matrix, and its scratch memory grows linearly with the length."""

    def scratch(length, block):
        shape = jax.ShapeDtypeStruct((1, 2, length, 32), jnp.float32)
        positions = jax.ShapeDtypeStruct((1, length), jnp.int32)
        loss = lambda q, k, v, qp, kp: jnp.sum(attention.attention(q, k, v, qp, kp, block))
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape, positions,
                                                                    positions).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    scores_bytes = 2 * 2048 * 2048 * 4
    assert scratch(2048, 2048) >= scores_bytes  # dense: the test can see a score matrix
    assert scratch(2048, 256) < scores_bytes / 4
    assert scratch(2048, 256) < 2.5 * scratch(1024, 256)


def test_decoder_logprobs_and_gradients_are_the_same_blockwise():
    """The decoder with 4-key blocks (prefill and training blockwise) against the dense one (which
    tests/models/test_parity.py checks against transformers): token log-probs and every gradient."""
    from scope_jax.logprobs import token_logprobs
    from scope_jax.models import ModelConfig, init

    config = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)
    graphdef_dense, params = init(config, seed=0)
    graphdef_blocks, _ = init(config, seed=0, attention_block=4)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 64, (2, 24)))
    positions = jnp.broadcast_to(jnp.arange(24), tokens.shape)

    def loss(graphdef):
        return jax.jit(jax.value_and_grad(
            lambda p: -jnp.sum(token_logprobs(graphdef, p, tokens, positions, chunk_size=8).logprobs)))

    (dense, dense_grad), (blocks, blocks_grad) = loss(graphdef_dense)(params), loss(graphdef_blocks)(params)
    np.testing.assert_allclose(float(blocks), float(dense), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(blocks_grad), jax.tree.leaves(dense_grad)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


@pytest.mark.parametrize("block", [64, 4], ids=["one-tile", "blockwise"])
def test_grouped_queries_come_back_token_major_with_the_same_gradients(block):
    """Three query heads per kv head, each over the same 7 positions, folded head-major into the query axis:
    the output is the float64 reference's, laid out [N, L, heads * groups * d] (query head h of kv head h //
    groups), and the gradients those of autodiff through the plain softmax and the same transpose."""
    groups, length = 3, 7
    _, k, v, token_positions, k_pos = case(length, 9, seed=4)
    q_tokens = jnp.asarray(np.random.default_rng(5).normal(size=(N, length, H * groups * D)), jnp.float32)
    q = attention.fold_queries(q_tokens, H, groups)
    q_pos = jnp.tile(token_positions, (1, groups))
    tokens_major = lambda x: np.asarray(x).reshape(N, H, groups, length, D).transpose(0, 3, 1, 2, 4).reshape(
        N, length, -1)
    np.testing.assert_array_equal(np.asarray(attention.unfold_queries(q, groups)), np.asarray(q_tokens))
    ours = jax.jit(attention.attention, static_argnums=(5, 6))(q, k, v, q_pos, k_pos, block, groups)
    np.testing.assert_allclose(np.asarray(ours), tokens_major(reference(q, k, v, q_pos, k_pos)), atol=2e-6)

    weights = jnp.asarray(np.random.default_rng(6).normal(size=ours.shape), jnp.float32)
    grouped = lambda q, k, v: jnp.sum(attention.attention(q, k, v, q_pos, k_pos, block, groups) * weights)
    plain_tokens = lambda q, k, v: jnp.sum(
        plain(q, k, v, q_pos, k_pos).reshape(N, H, groups, length, D).transpose(0, 3, 1, 2, 4).reshape(
            N, length, -1) * weights)
    expected = jax.grad(plain_tokens, argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", jax.jit(jax.grad(grouped, argnums=(0, 1, 2)))(q, k, v), expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)
