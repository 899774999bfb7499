"""One decoder-only transformer in flax.nnx for the Llama (SmolLM2), Qwen2 and Qwen3 families.

Parameter names follow Hugging Face (`embed_tokens`, `q_proj`, `input_layernorm`, ...) so loading is a
rename-free transpose. The layers are one `Block` whose parameters carry a leading layer axis and are
run with `lax.scan`: a 30-layer model compiles as fast as a 1-layer one.

Positions are explicit per row. With a KV cache the token at position p is written to cache slot p and
attends to slots <= p, so rows of different lengths share one static-shape cache: prompts are
right-padded, and a row's padding slots are overwritten by its own generated tokens before any query
can see them. With a `SharedPrefix` (keys and values of prompt prefixes computed once per group of rows),
row b first sees the first `lengths[b]` tokens of its group's prefix, and its own cache holds the tokens
from there on: the token at position p goes to slot p - lengths[b].

Attention is `scope_jax.models.attention`: dense for short sequences, blockwise beyond
`attention_block`^2 scores per head.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from scope_jax.models import attention, cpu_gemm
from scope_jax.models.cpu_gemm import dense
from scope_jax.models.config import ModelConfig
from scope_jax.models.layouts import residuals_as_bits, residuals_from_bits, xla_cpu_layouts

Params = dict  # the pure-dict state of a Decoder, as returned by `split`


class KVCache(NamedTuple):
    """Keys and values of every layer: [num_layers, batch, num_kv_heads, max_len, head_dim].

    Heads come before positions so that the attention matmuls read a layer's cache as it lies in memory
    (with positions first, XLA transposes the whole cache of every layer at every decoding step).
    """

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, config: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


LayerCache = tuple[jax.Array, jax.Array]  # one layer's (k, v) [batch, num_kv_heads, max_len, head_dim]


class SharedPrefix(NamedTuple):
    """Prompt prefixes shared by groups of consecutive rows: their keys and values `cache`
    [num_layers, groups, num_kv_heads, prefix_len, head_dim], and how many of its group's prefix tokens each
    row sees, `lengths` [batch] (where that row's own positions start)."""

    cache: KVCache
    lengths: jax.Array


def layer_prefixes(prefix: SharedPrefix | None, num_layers: int) -> list[tuple[jax.Array, ...] | None]:
    """The `prefix` each layer takes: its (k, v, lengths), or None for every layer without a prefix."""
    if prefix is None:
        return [None] * num_layers
    return [(k, v, prefix.lengths) for k, v in zip(prefix.cache.k, prefix.cache.v)]


def rope_inverse_frequencies(config: ModelConfig) -> jax.Array:
    """RoPE inverse frequencies theta^(-2i/d), with llama3-style long-context scaling if configured."""
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, config.head_dim, 2, dtype=jnp.float32)
                                            / config.head_dim))
    if config.rope_scaling is None:
        return inv_freq
    scaling = dict(config.rope_scaling)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(is_medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate [B, L, H, D] by angle position * inv_freq (HF's rotate-half layout), in float32."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, L, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class RMSNorm(nnx.Module):
    """y = w * x / sqrt(mean(x^2) + eps), normalised in float32 and cast back (as HF does)."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: jax.Array, axis: int = -1) -> jax.Array:
        """Normalised over `axis` (0: a feature-major [d, B] activation)."""
        weight = self.weight[...].astype(x.dtype)  # float32 master weights keep bfloat16 compute bfloat16
        if axis != -1:
            weight = weight.reshape((-1,) + (1,) * (x.ndim - 1 - axis))
        return rms_norm(x, weight, self.eps, axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm(x: jax.Array, weight: jax.Array, eps: float, axis: int) -> jax.Array:
    """weight * x / sqrt(mean(x^2 over `axis`) + eps), normalised in float32 and cast back to x's dtype;
    `weight` in x's dtype, broadcastable against x. The backward pass is written out so that it keeps
    only x and the inverse root, where autodiff also kept the normalised x and a second statistic."""
    return _rms_norm_forward(x, weight, eps, axis)[0]


@residuals_as_bits
def _rms_norm_forward(x, weight, eps, axis):
    x32 = x.astype(jnp.float32)
    inverse_root = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + eps)
    return _normalized(x, weight, inverse_root), (x, inverse_root, weight)


def _normalized(x, weight, inverse_root):
    return weight * (x.astype(jnp.float32) * inverse_root).astype(x.dtype)


@residuals_from_bits
def _rms_norm_backward(eps, axis, residuals, grad):
    x, inverse_root, weight = residuals
    normed = x.astype(jnp.float32) * inverse_root
    shape = (1,) * (grad.ndim - weight.ndim) + weight.shape
    d_weight = jnp.sum(grad * normed.astype(x.dtype), axis=tuple(i for i, n in enumerate(shape) if n == 1))
    d_normed = (grad * weight).astype(jnp.float32)
    d_x = inverse_root * (d_normed - normed * jnp.mean(d_normed * normed, axis=axis, keepdims=True))
    return d_x.astype(x.dtype), d_weight.reshape(weight.shape)


rms_norm.defvjp(_rms_norm_forward, _rms_norm_backward)


@jax.custom_vjp
def projection(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x @ kernel over the last axis of x, whose kernel gradient takes `weight_grad`'s form."""
    return dense(x, kernel)


@residuals_as_bits
def _projection_forward(x, kernel):
    return dense(x.value, kernel.value), (x.value if kernel.perturbed else None, kernel.value)


@residuals_from_bits
def _projection_backward(residuals, grad):
    x, kernel = residuals
    return dense(grad, kernel, transpose_kernel=True), None if x is None else weight_grad(x, grad)


projection.defvjp(_projection_forward, _projection_backward, symbolic_zeros=True)


class Linear(nnx.Linear):
    """nnx.Linear (same parameters and casts) computed by `projection`."""

    def __call__(self, x: jax.Array) -> jax.Array:
        x, kernel, bias = self.promote_dtype((x, self.kernel[...], self.bias[...] if self.use_bias else None),
                                             dtype=self.dtype)
        y = projection(x, kernel)
        return y if bias is None else y + bias


def _linear(d_in: int, d_out: int, bias: bool, dtype, param_dtype, rngs: nnx.Rngs) -> Linear:
    return Linear(d_in, d_out, use_bias=bias, dtype=dtype, param_dtype=param_dtype,
                  kernel_init=nnx.initializers.normal(0.02), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs, block: int):
        c, hd = config, config.head_dim
        self.config = config
        self.block = block
        self.q_proj = _linear(c.hidden_size, c.num_heads * hd, c.attention_bias, dtype, param_dtype, rngs)
        self.k_proj = _linear(c.hidden_size, c.num_kv_heads * hd, c.attention_bias, dtype, param_dtype, rngs)
        self.v_proj = _linear(c.hidden_size, c.num_kv_heads * hd, c.attention_bias, dtype, param_dtype, rngs)
        self.o_proj = _linear(c.num_heads * hd, c.hidden_size, False, dtype, param_dtype, rngs)
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, c.rms_norm_eps, param_dtype=param_dtype)
            self.k_norm = RMSNorm(hd, c.rms_norm_eps, param_dtype=param_dtype)

    def __call__(self, x, positions, inv_freq, cache: tuple[jax.Array, jax.Array] | None,
                 prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None):
        """x [B, L, d] at positions [B, L]; cache: this layer's (k, v); prefix: this layer's shared
        (k, v) [groups, kv_heads, prefix_len, head_dim] and the prefix tokens each row sees [B]."""
        c = self.config
        b, length, _ = x.shape
        q = self.q_proj(x).reshape(b, length, c.num_heads, c.head_dim)
        k = self.k_proj(x).reshape(b, length, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).reshape(b, length, c.num_kv_heads, c.head_dim)
        out, cache = self.attend(q, k, v, positions, inv_freq, cache, prefix)
        return self.o_proj(out.astype(x.dtype)), cache

    def attend(self, q, k, v, positions, inv_freq, cache, prefix):
        """The attention output [B, L, heads * head_dim] (before o_proj) of projected q [B, L, heads,
        head_dim], k, v [B, L, kv_heads, head_dim], and the updated cache (see `__call__`)."""
        c = self.config
        b, length = positions.shape
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # [B, kv_heads, L, head_dim], the cache layout

        if cache is None:
            key_positions = positions
        else:
            # Each row's chunk is contiguous from positions[:, 0]: write it into the cache at that slot.
            offsets = jnp.zeros((b,), jnp.int32) if prefix is None else prefix[2]
            write = jax.vmap(lambda buf, new, start: jax.lax.dynamic_update_slice(buf, new, (0, start, 0)))
            cache = (write(cache[0], k.astype(cache[0].dtype), positions[:, 0] - offsets),
                     write(cache[1], v.astype(cache[1].dtype), positions[:, 0] - offsets))
            k, v = cache
            key_positions = jnp.arange(k.shape[2], dtype=jnp.int32)[None, :] + offsets[:, None]

        # Query heads grouped by their kv head, [B, kv_heads, groups * L, head_dim]: with every operand
        # laid out as [batch dims..., rows, contraction] XLA:CPU runs both matmuls without transposing the
        # cache and several times faster than from the [B, L, heads, head_dim] layout.
        groups = c.num_heads // c.num_kv_heads
        q = attention.fold_queries(q.reshape(b, length, c.num_heads * c.head_dim), c.num_kv_heads, groups)
        query_positions = jnp.tile(positions, (1, groups))
        if prefix is None:
            return attention.attention(q, k, v, query_positions, key_positions, self.block, groups), cache
        partial = attention.shared_prefix(q, prefix[0], prefix[1], prefix[2], self.block)
        partial = attention.accumulate(partial, q, k, v, query_positions, key_positions, self.block)
        return attention.unfold_queries(attention.normalize(partial, v.dtype), groups), cache


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def normed_swiglu_mlp(x: jax.Array, norm_weight: jax.Array, w_gate: jax.Array, w_up: jax.Array,
                      w_down: jax.Array, eps: float) -> jax.Array:
    """(silu(n W_gate) * n W_up) W_down of n = rms_norm(x, norm_weight, eps) over the last axis, with a
    hand-written backward pass. It keeps x, which the layer keeps anyway for the norm, rather than n, and
    computes n again: one activation fewer saved per layer."""
    normed = rms_norm(x, norm_weight, eps, -1)
    return dense(jax.nn.silu(dense(normed, w_gate)) * dense(normed, w_up), w_down)


@residuals_as_bits
def _normed_swiglu_mlp_forward(x, norm_weight, w_gate, w_up, w_down, eps):
    normed, (_, inverse_root, _) = _rms_norm_forward(x, norm_weight, eps, -1)
    gate, up = dense(normed, w_gate), dense(normed, w_up)
    residuals = (x, inverse_root, norm_weight, gate, up, w_gate, w_up, w_down)
    return dense(jax.nn.silu(gate) * up, w_down), residuals


def weight_grad(inputs: jax.Array, grad: jax.Array) -> jax.Array:
    """sum over tokens of inputs^T grad, [d_in, d_out]: in float32 on XLA:CPU by `cpu_gemm`, otherwise on
    XLA:CPU computed as (grad^T inputs)^T.

    XLA:CPU's dot wants the right operand of a weight-gradient matmul transposed. Written the autodiff way
    (inputs^T grad) that operand is `grad`, which XLA then computes column-wise inside the elementwise
    fusion that produces it (the largest single cost of the backward pass); this way it is `inputs`, a
    plain copy. The barrier stops XLA from swapping the operands back.
    """
    tokens = lambda a: a.reshape(math.prod(a.shape[:-1]), a.shape[-1])  # also for a rank-0 update's [..., 0]
    if cpu_gemm.uses_mkl(inputs, grad):
        return cpu_gemm.matmul(tokens(inputs), tokens(grad), transpose_a=True)
    if not xla_cpu_layouts():
        return tokens(inputs).T @ tokens(grad)
    return jax.lax.optimization_barrier(tokens(grad).T @ tokens(inputs)).T


@residuals_from_bits
def _normed_swiglu_mlp_backward(eps, residuals, grad):
    x, inverse_root, norm_weight, gate, up, w_gate, w_up, w_down = residuals
    normed = _normalized(x, norm_weight, inverse_root)
    s = jax.nn.sigmoid(gate)
    act = gate * s
    d_hidden = dense(grad, w_down, transpose_kernel=True)
    d_gate = d_hidden * up * s * (1 + gate * (1 - s))
    d_up = d_hidden * act
    d_normed = dense(d_gate, w_gate, transpose_kernel=True) + dense(d_up, w_up, transpose_kernel=True)
    d_x, d_norm_weight = _rms_norm_backward(eps, -1, (x, inverse_root, norm_weight), d_normed)
    return (d_x, d_norm_weight, weight_grad(normed, d_gate), weight_grad(normed, d_up),
            weight_grad(act * up, grad))


normed_swiglu_mlp.defvjp(_normed_swiglu_mlp_forward, _normed_swiglu_mlp_backward)


class MLP(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(d, f, False, dtype, param_dtype, rngs)
        self.up_proj = _linear(d, f, False, dtype, param_dtype, rngs)
        self.down_proj = _linear(f, d, False, dtype, param_dtype, rngs)

    def __call__(self, x: jax.Array, norm: RMSNorm) -> jax.Array:
        """The MLP of norm(x), normalised inside `normed_swiglu_mlp`."""
        projections = (self.gate_proj, self.up_proj, self.down_proj)
        return normed_swiglu_mlp(x, norm.weight[...].astype(x.dtype),
                                 *(p.kernel[...].astype(x.dtype) for p in projections), norm.eps)


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs, attention_block: int):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = Attention(config, dtype, param_dtype, rngs, attention_block)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                                param_dtype=param_dtype)
        self.mlp = MLP(config, dtype, param_dtype, rngs)

    def __call__(self, x, positions, inv_freq, cache, prefix=None):
        h, cache = self.self_attn(self.input_layernorm(x), positions, inv_freq, cache, prefix)
        x = x + h
        return x + self.mlp(x, self.post_attention_layernorm), cache

    def decode_weights(self) -> "DecodeWeights":
        """This layer's kernels laid out for `decode_step` (a copy: make it once, outside the loop)."""
        attn, mlp = self.self_attn, self.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        bias = (jnp.concatenate([p.bias[...] for p in projections]) if attn.config.attention_bias else None)
        gate_up = jnp.concatenate([mlp.gate_proj.kernel[...].T, mlp.up_proj.kernel[...].T])
        return DecodeWeights(qkv=jnp.concatenate([p.kernel[...].T for p in projections]), qkv_bias=bias,
                             o=attn.o_proj.kernel[...].T, gate_up=gate_up, down=mlp.down_proj.kernel[...].T)

    def decode_step(self, weights: "DecodeWeights", x: jax.Array, positions, inv_freq, cache, prefix=None):
        """This layer on one token per row, feature-major: x [d, B] at positions [B, 1] (the same
        result as `__call__` on x.T[:, None]). XLA:CPU runs a [out, in] @ [in, B] matmul with a few columns
        several times faster than [B, in] @ [in, out], and a decode step is little but such matmuls."""
        c = self.self_attn.config
        dtype = x.dtype
        qkv = weights.qkv.astype(dtype) @ self.input_layernorm(x, axis=0)
        if weights.qkv_bias is not None:
            qkv = qkv + weights.qkv_bias.astype(dtype)[:, None]
        # Left to itself, XLA folds the transpose below into the matmul, which then runs token-major on
        # XLA:CPU's slower generic dot; the barrier keeps the fast [out, in] @ [in, B] form.
        if xla_cpu_layouts():
            qkv = jax.lax.optimization_barrier(qkv)
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q, k, v = jnp.split(qkv.T[:, None], [q_size, q_size + kv_size], axis=-1)  # each [B, 1, size]
        heads = lambda a, n: a.reshape(a.shape[0], 1, n, c.head_dim)
        out, cache = self.self_attn.attend(heads(q, c.num_heads), heads(k, c.num_kv_heads),
                                           heads(v, c.num_kv_heads), positions, inv_freq, cache, prefix)
        x = x + weights.o.astype(dtype) @ out[:, 0].astype(dtype).T
        gate, up = jnp.split(weights.gate_up.astype(dtype) @ self.post_attention_layernorm(x, axis=0), 2)
        return x + weights.down.astype(dtype) @ (jax.nn.silu(gate) * up), cache


class DecodeWeights(NamedTuple):
    """One layer's kernels for `Block.decode_step`, [out, in]: q, k and v fused, gate and up fused."""

    qkv: jax.Array
    qkv_bias: jax.Array | None
    o: jax.Array
    gate_up: jax.Array
    down: jax.Array


class Decoder(nnx.Module):
    """Decoder-only LM. `__call__` returns float32 logits; `hidden` + `logits` let callers chunk the head.

    Args:
      config: the architecture.
      dtype: computation dtype of activations (float32 or bfloat16).
      param_dtype: storage dtype of parameters.
      remat: recompute each layer in the backward pass (less activation memory, ~1/3 more compute).
      attention_block: attention runs blockwise beyond attention_block^2 scores per (row, kv head).
      block: the layer class, called as block(config, dtype, param_dtype, rngs, attention_block) (a LoRA
        layer: `scope_jax.models.lora`).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
                 remat: bool = False, attention_block: int = attention.BLOCK,
                 block: Callable[..., "Block"] = Block):
        self.config = config
        self.remat = remat
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, dtype=dtype,
                                      param_dtype=param_dtype, embedding_init=nnx.initializers.normal(0.02),
                                      rngs=rngs)

        @nnx.split_rngs(splits=config.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_layers(rngs: nnx.Rngs) -> Block:
            return block(config, dtype, param_dtype, rngs, attention_block)

        self.layers = make_layers(rngs)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
        if not config.tie_word_embeddings:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, False, dtype, param_dtype, rngs)

    def hidden(self, tokens: jax.Array, positions: jax.Array, cache: KVCache | None = None,
               prefix: SharedPrefix | None = None) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states [B, L, d] of `tokens` [B, L] at `positions` [B, L] (and the new cache)."""
        chex.assert_rank([tokens, positions], 2)
        chex.assert_equal_shape([tokens, positions])
        x = self.embed_tokens(tokens)
        inv_freq = rope_inverse_frequencies(self.config)
        graphdef, layer_params = nnx.split(self.layers)

        def layer(x, scanned):
            params, layer_cache, layer_prefix = scanned
            if layer_prefix is not None:
                layer_prefix = (*layer_prefix, prefix.lengths)
            return nnx.merge(graphdef, params)(x, positions, inv_freq, layer_cache, layer_prefix)

        if self.remat:
            layer = jax.checkpoint(layer)
        scanned = (layer_params, None if cache is None else tuple(cache),
                   None if prefix is None else tuple(prefix.cache))
        x, new_cache = jax.lax.scan(layer, x, scanned)
        return self.norm(x), (None if cache is None else KVCache(*new_cache))

    def blocks(self) -> list[Block]:
        """The layers as separate modules, each over its own slice of the stacked weights: for loops that
        run the layers one after another, unrolled (XLA:CPU copies a layer's slice out of a stacked array at
        every step of a scan)."""
        graphdef, stacked = nnx.split(self.layers)
        layer = lambda i: jax.tree.map(lambda a: a[i], stacked)
        return [nnx.merge(graphdef, layer(i)) for i in range(self.config.num_layers)]

    def hidden_by_layer(self, tokens: jax.Array, positions: jax.Array, caches: Sequence[LayerCache],
                        prefix: SharedPrefix | None = None) -> tuple[jax.Array, list[LayerCache]]:
        """`hidden` over a cache held layer by layer, caches[i] = layer i's (k, v) [B, kv_heads, slots,
        head_dim], with the layers unrolled: each layer writes its new keys and values into its own arrays,
        in place when they are donated. (A scan over a stacked cache copies every layer's whole cache out
        and back at every call.)"""
        chex.assert_rank([tokens, positions], 2)
        chex.assert_equal_shape([tokens, positions])
        chex.assert_equal(len(caches), self.config.num_layers)
        x = self.embed_tokens(tokens)
        inv_freq = rope_inverse_frequencies(self.config)
        prefixes = layer_prefixes(prefix, len(caches))
        new_caches = []
        for block, cache, layer_prefix in zip(self.blocks(), caches, prefixes):
            x, cache = block(x, positions, inv_freq, cache, layer_prefix)
            new_caches.append(cache)
        return self.norm(x), new_caches

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., vocab] of final hidden states [..., d]."""
        return jnp.einsum("...d,dv->...v", hidden, self.head_weight().astype(hidden.dtype),
                          preferred_element_type=jnp.float32)

    def head_weight(self) -> jax.Array:
        """The output projection [d, vocab] (the transposed embedding when tied)."""
        weight, vocab_major = self.head_weight_as_stored()
        return weight.T if vocab_major else weight

    def head_weight_as_stored(self) -> tuple[jax.Array, bool]:
        """(the output projection as stored, whether it is vocab-major): the tied embedding [vocab, d], or
        the head's kernel [d, vocab]."""
        if self.config.tie_word_embeddings:
            return self.embed_tokens.embedding[...], True
        return self.lm_head.kernel[...], False

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
        hidden, cache = self.hidden(tokens, positions, cache)
        return self.logits(hidden), cache


def init(config: ModelConfig, seed: int = 0, *, dtype=jnp.float32, param_dtype=jnp.float32,
         remat: bool = False, attention_block: int = attention.BLOCK) -> tuple[nnx.GraphDef, Params]:
    """A randomly initialised decoder as (graphdef, params), params a plain nested dict of arrays."""
    return split(Decoder(config, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=param_dtype, remat=remat,
                         attention_block=attention_block))


def split(model: Decoder) -> tuple[nnx.GraphDef, Params]:
    graphdef, state = nnx.split(model)
    return graphdef, state.to_pure_dict()


def state_of(params: Params | Any) -> Params:
    """The decoder state of `params`: a plain dict as it is, or what a structured params pytree makes
    (`decoder_state()`; a LoRA base + adapter, `scope_jax.models.lora.LoRAParams`)."""
    return params if isinstance(params, dict) else params.decoder_state()


def bind(graphdef: nnx.GraphDef, params: Params | Any) -> Decoder:
    """The decoder of plain or structured params (see `state_of`)."""
    return nnx.merge(graphdef, state_of(params))


def population_axes(params: Params | Any) -> Any:
    """`vmap` in_axes of a population's params: every leaf's leading axis for plain dicts; a structured
    params pytree says which of its parts are stacked (`population_axes()`: a LoRA population stacks
    the adapters only, over one shared base)."""
    return 0 if isinstance(params, dict) else params.population_axes()


def _per_part(fn: Callable[[Any], Any], params: Params | Any,
              shared: Callable[[Any], Any] = lambda t: t) -> Any:
    """`params` with fn applied to each leaf of its stacked parts and `shared` to each shared part."""
    part = lambda axis, tree: shared(tree) if axis is None else jax.tree.map(fn, tree)
    return jax.tree.map(part, population_axes(params), params, is_leaf=lambda a: a is None)


def population_of_one(params: Params | Any) -> Any:
    """One model's params as a population of one (the stacked leaves given a leading axis of 1)."""
    return _per_part(lambda x: x[None], params)


def population_member(params: Params | Any, index: int) -> Any:
    """Member `index` of a population's params."""
    return _per_part(lambda x: x[index], params)


def population_size(params: Params | Any) -> int:
    """P, the leading axis of a population's stacked leaves."""
    return jax.tree.leaves(_per_part(lambda x: x.shape[0], params, shared=lambda _: None))[0]


def forward(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, positions: jax.Array,
            cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
    """Pure forward: float32 logits [B, L, V] and the updated cache."""
    return bind(graphdef, params)(tokens, positions, cache)


# Megatron-style tensor parallelism inside each layer, FSDP over the model dimension. Stacked layer
# parameters carry the layer axis first (never sharded).
PARTITION_RULES = (
    (r"embed_tokens/embedding$", P("tensor", "fsdp")),
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", P(None, "fsdp", "tensor")),
    (r"(q_proj|k_proj|v_proj)/bias$", P(None, "tensor")),
    (r"(o_proj|down_proj)/kernel$", P(None, "tensor", "fsdp")),
    (r"lm_head/kernel$", P("fsdp", "tensor")),
    (r".*", P()),
)
