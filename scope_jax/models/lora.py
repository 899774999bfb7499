"""LoRA: low-rank adapters beside a frozen, shared base decoder.

A LoRA model is `(graphdef, LoRAParams(base, adapter))`. `base` is the plain params dict of a decoder
(unchanged, shared); `adapter` is a small dict of its own with, for each target projection, `lora_a`
[layers, in, rank] and `lora_b` [layers, rank, out]. The graphdef is the decoder's with `LoRABlock`
layers, whose target projections compute x W + (alpha / rank) (x A) B: the adapter is never merged into
the weights on the forward and training path, so a population of P adapters over one base (the adapter
leaves stacked [P, ...], the base not) costs P adapters, not P models.

Every function that takes `(graphdef, params)` takes a LoRA model as it is: it binds params through
`decoder.bind` (which asks `LoRAParams.decoder_state()` for the decoder's state, the base under
`stop_gradient`, so no base gradient is ever computed) and vmaps a population over
`decoder.population_axes(params)` (the adapter only). In the optimizer the base is labelled frozen
(`trainable_labels`).

`lora_b` starts at zero, so a fresh adapter leaves the base's outputs unchanged. Adapters save and load on
their own (`save_adapter`, `load_adapter`: one safetensors file and its settings as json); `merge` gives
the plain model W + (alpha / rank) A B, for `hf.save_pretrained`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax.models import decoder
from scope_jax.models.decoder import MLP, Block, Decoder, DecodeWeights, Params, weight_grad

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "adapter_config.json"


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """rank: the adapters' inner dimension; alpha: their output is scaled by alpha / rank; targets: the
    adapted projections, among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        unknown = [t for t in self.targets if t not in ATTENTION_TARGETS + MLP_TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoRA targets {self.targets} must be distinct names among "
                             f"{ATTENTION_TARGETS + MLP_TARGETS}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRAParams(NamedTuple):
    """A decoder's params as a frozen `base` (a plain params dict, shared) and its `adapter`."""

    base: Params
    adapter: Params

    def decoder_state(self) -> Params:
        """The state of the LoRA graphdef: the base (under stop_gradient) with the adapter's leaves."""
        return _merge_dicts(jax.tree.map(jax.lax.stop_gradient, self.base), self.adapter)

    def population_axes(self) -> "LoRAParams":
        """A population stacks the adapters on a leading axis and shares the base."""
        return LoRAParams(base=None, adapter=0)


def _merge_dicts(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge_dicts(a[key], value) if isinstance(value, dict) else value
    return out


def trainable_labels(params: Params | LoRAParams, label: str, frozen: str) -> Any:
    """An optimizer label prefix tree for one role's params: `label` for all of a plain model, `frozen`
    for a LoRA model's base and `label` for its adapter."""
    return LoRAParams(base=frozen, adapter=label) if isinstance(params, LoRAParams) else label


@jax.custom_vjp
def adapted_matmul(x: jax.Array, kernel: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """x (W + A B) over the last axis of x, in x's dtype, for a frozen kernel W: the forward merges A B
    into W (one matmul of x instead of three, the merge in W's dtype) and the backward computes x's, A's
    and B's gradients only; differentiating W is refused."""
    return x @ _merged(kernel, a, b, x.dtype)


def _merged(kernel: jax.Array, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    return (kernel + a @ b).astype(dtype)


def _adapted_matmul_forward(x, kernel, a, b):
    if kernel.perturbed:
        raise ValueError("adapted_matmul differentiates x and the adapter only: its kernel must be frozen "
                         "(a LoRA base under stop_gradient)")
    x, kernel, a, b = (p.value for p in (x, kernel, a, b))
    return x @ _merged(kernel, a, b, x.dtype), (x, x @ a.astype(x.dtype), kernel, a, b)


def _adapted_matmul_backward(residuals, grad):
    # The merged kernel is made again rather than kept: under a population's vmap, P kept copies of every
    # kernel would cost P models, the merge itself is a rank-r product.
    x, xa, kernel, a, b = residuals
    d_xa = grad @ b.astype(grad.dtype).T
    return (grad @ _merged(kernel, a, b, grad.dtype).T, None, weight_grad(x, d_xa).astype(a.dtype),
            weight_grad(xa, grad).astype(b.dtype))


adapted_matmul.defvjp(_adapted_matmul_forward, _adapted_matmul_backward, symbolic_zeros=True)


class LoRALinear(nnx.Linear):
    """nnx.Linear plus a low-rank update: x W + b + scale (x A) B, with A `lora_a` [in, rank] and B
    `lora_b` [rank, out], computed as x (W + scale A B) + b (`adapted_matmul`)."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, scale: float, use_bias: bool,
                 dtype, param_dtype, rngs: nnx.Rngs):
        super().__init__(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         rngs=rngs)
        self.lora_a = nnx.Param(jnp.zeros((in_features, rank), param_dtype))
        self.lora_b = nnx.Param(jnp.zeros((rank, out_features), param_dtype))
        self.scale = scale

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype or jnp.result_type(x, self.kernel[...]))
        y = adapted_matmul(x, self.kernel[...], self.lora_a[...], self.scale * self.lora_b[...])
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class LoRAMLP(MLP):
    """The SwiGLU MLP through its projection modules (LoRA or plain), differentiated by autodiff: with
    the base frozen there is no weight gradient for `decoder.swiglu_mlp`'s hand-written backward to save."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class LowRankKernel(NamedTuple):
    """A feature-major map `kernel` [out, in] plus a low-rank update: kernel @ x + up @ (down @ x), with
    `down` [rank, in] and `up` [out, rank] (the scale folded in). Stands in for a kernel array in
    `DecodeWeights`, so `Block.decode_step` runs a LoRA layer unchanged and unmerged."""

    kernel: jax.Array
    down: jax.Array
    up: jax.Array

    def astype(self, dtype) -> "LowRankKernel":
        return LowRankKernel(*(a.astype(dtype) for a in self))

    def __matmul__(self, x: jax.Array) -> jax.Array:
        return self.kernel @ x + self.up @ (self.down @ x)


def _low_rank(kernel: jax.Array, projections: list[nnx.Linear]) -> LowRankKernel:
    """`kernel` (the projections' kernels, transposed and stacked on the output axis) with their updates;
    a plain projection has none (rank 0)."""
    downs, ups = [], []
    for p in projections:
        if isinstance(p, LoRALinear):
            downs.append(p.lora_a[...].T)
            ups.append(p.scale * p.lora_b[...].T)
        else:
            downs.append(jnp.zeros((0, p.in_features), kernel.dtype))
            ups.append(jnp.zeros((p.out_features, 0), kernel.dtype))
    return LowRankKernel(kernel, jnp.concatenate(downs), jax.scipy.linalg.block_diag(*ups))


class LoRABlock(Block):
    """A decoder layer whose `config.targets` projections are `LoRALinear`."""

    def __init__(self, lora: LoRAConfig, config, dtype, param_dtype, rngs: nnx.Rngs, attention_block: int):
        super().__init__(config, dtype, param_dtype, rngs, attention_block)
        self.mlp = LoRAMLP(config, dtype, param_dtype, rngs)
        for name in lora.targets:
            owner = self.self_attn if name in ATTENTION_TARGETS else self.mlp
            plain = getattr(owner, name)
            setattr(owner, name, LoRALinear(plain.in_features, plain.out_features, rank=lora.rank,
                                            scale=lora.scale, use_bias=plain.use_bias, dtype=dtype,
                                            param_dtype=param_dtype, rngs=rngs))

    def decode_weights(self) -> DecodeWeights:
        weights = super().decode_weights()
        attn, mlp = self.self_attn, self.mlp
        return weights._replace(qkv=_low_rank(weights.qkv, [attn.q_proj, attn.k_proj, attn.v_proj]),
                                o=_low_rank(weights.o, [attn.o_proj]),
                                gate_up=_low_rank(weights.gate_up, [mlp.gate_proj, mlp.up_proj]),
                                down=_low_rank(weights.down, [mlp.down_proj]))


def _graphdef(model: Decoder, block) -> tuple[nnx.GraphDef, Params]:
    """The graphdef (and abstract params) of `model`'s architecture and settings with layers `block`."""
    settings = dict(dtype=model.embed_tokens.dtype, param_dtype=model.embed_tokens.param_dtype,
                    remat=model.remat, attention_block=model.layers.self_attn.block)
    return decoder.split(nnx.eval_shape(lambda: Decoder(model.config, rngs=nnx.Rngs(0), block=block,
                                                        **settings)))


def _owner(name: str) -> str:
    return "self_attn" if name in ATTENTION_TARGETS else "mlp"


def init(graphdef: nnx.GraphDef, params: Params, config: LoRAConfig,
         seed: int = 0) -> tuple[nnx.GraphDef, LoRAParams]:
    """A fresh adapter on the plain model (graphdef, params): the LoRA graphdef and LoRAParams(params,
    adapter). A is uniform in +-1/sqrt(in) (peft's default), B is zero: the outputs are the base's."""
    if not isinstance(params, dict):
        raise TypeError(f"lora.init takes a plain model's params, got {type(params).__name__}")
    lora_graphdef, shapes = _graphdef(nnx.merge(graphdef, params), functools.partial(LoRABlock, config))
    keys = iter(jax.random.split(jax.random.key(seed), len(config.targets)))
    adapter: dict = {}
    for name in config.targets:
        a = shapes["layers"][_owner(name)][name]["lora_a"]
        bound = 1.0 / np.sqrt(a.shape[1])
        adapter.setdefault(_owner(name), {})[name] = {
            "lora_a": jax.random.uniform(next(keys), a.shape, a.dtype, -bound, bound),
            "lora_b": jnp.zeros(shapes["layers"][_owner(name)][name]["lora_b"].shape, a.dtype)}
    return lora_graphdef, LoRAParams(base=params, adapter={"layers": adapter})


def merge(graphdef: nnx.GraphDef, params: LoRAParams) -> tuple[nnx.GraphDef, Params]:
    """The plain model with every adapted kernel replaced by W + scale A B (for `hf.save_pretrained`)."""
    model = decoder.bind(graphdef, params)
    plain_graphdef, _ = _graphdef(model, Block)
    merged = jax.tree.map(lambda x: x, params.base)  # new dicts, the same arrays
    for owner, projections in params.adapter["layers"].items():
        for name, factors in projections.items():
            kernel = merged["layers"][owner][name]["kernel"]
            scale = getattr(getattr(model.layers, owner), name).scale
            update = scale * jnp.einsum("lir,lro->lio", factors["lora_a"], factors["lora_b"],
                                        precision=jax.lax.Precision.HIGHEST)
            merged_kernel = kernel + update.astype(kernel.dtype)
            merged["layers"][owner][name]["kernel"] = merged_kernel.astype(kernel.dtype)
    return plain_graphdef, merged


def save_adapter(folder: str | os.PathLike, adapter: Params, config: LoRAConfig) -> None:
    """Write `adapter` as `adapter.safetensors` ("layers.self_attn.q_proj.lora_a", ... [layers, in, rank])
    and `config` as `adapter_config.json` in `folder`."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {".".join(str(k.key) for k in path): np.ascontiguousarray(jax.device_get(leaf))
            for path, leaf in jax.tree_util.tree_leaves_with_path(adapter)}
    save_file(flat, str(folder / ADAPTER_FILE))
    settings = {"rank": config.rank, "alpha": config.alpha, "targets": list(config.targets)}
    (folder / CONFIG_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def load_adapter(folder: str | os.PathLike) -> tuple[LoRAConfig, Params]:
    """(its LoRAConfig, the adapter dict) of a folder written by `save_adapter`."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    for name in (ADAPTER_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} has no {name}: not an adapter folder written by save_adapter")
    config = LoRAConfig(**json.loads((folder / CONFIG_FILE).read_text()))
    adapter: dict = {}
    for key, value in load_file(str(folder / ADAPTER_FILE)).items():
        *parents, leaf = key.split(".")
        node = adapter
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = jnp.asarray(value)
    return config, adapter


def load(folder: str | os.PathLike, graphdef: nnx.GraphDef,
         params: Params) -> tuple[nnx.GraphDef, LoRAParams]:
    """The saved adapter in `folder` on the plain model (graphdef, params); shapes are checked, and the
    adapter takes the dtype a fresh adapter of this model has (a float32 adapter on a bfloat16 base)."""
    config, adapter = load_adapter(folder)
    lora_graphdef, fresh = init(graphdef, params, config)
    expected = jax.tree.map(lambda x: x.shape, fresh.adapter)
    found = jax.tree.map(lambda x: x.shape, adapter)
    if expected != found:
        raise ValueError(f"the adapter in {folder} does not fit this model: {found} != {expected}")
    return lora_graphdef, fresh._replace(adapter=jax.tree.map(lambda x, f: x.astype(f.dtype), adapter,
                                                              fresh.adapter))
