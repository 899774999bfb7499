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
their own (`save_adapter`, `load_adapter`: one safetensors file and its settings as json), in this
project's layout or in peft's (`LAYOUTS`; peft's is what transformers + peft and vLLM read); `merge` gives
the plain model W + (alpha / rank) A B, for `hf.save_pretrained`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax.models import decoder
from scope_jax.models.cpu_gemm import dense
from scope_jax.models.decoder import MLP, Block, Decoder, DecodeWeights, Params, weight_grad
from scope_jax.models.hf import read_safetensors
from scope_jax.models.layouts import residuals_as_bits, residuals_from_bits

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
ADAPTER_FILE = "adapter.safetensors"  # the scope_jax layout's weights
PEFT_ADAPTER_FILE = "adapter_model.safetensors"  # peft's
CONFIG_FILE = "adapter_config.json"  # both layouts' settings


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
    return dense(x, _merged(kernel, a, b, x.dtype))


def _merged(kernel: jax.Array, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    return (kernel if a.shape[-1] == 0 else kernel + a @ b).astype(dtype)  # rank 0: a plain projection


@residuals_as_bits
def _adapted_matmul_forward(x, kernel, a, b):
    if kernel.perturbed:
        raise ValueError("adapted_matmul differentiates x and the adapter only: its kernel must be frozen "
                         "(a LoRA base under stop_gradient)")
    x, kernel, a, b = (p.value for p in (x, kernel, a, b))
    return dense(x, _merged(kernel, a, b, x.dtype)), (x, x @ a.astype(x.dtype), kernel, a, b)


@residuals_from_bits
def _adapted_matmul_backward(residuals, grad):
    # The merged kernel is made again rather than kept: under a population's vmap, P kept copies of every
    # kernel would cost P models, the merge itself is a rank-r product.
    x, xa, kernel, a, b = residuals
    d_xa = grad @ b.astype(grad.dtype).T
    return (dense(grad, _merged(kernel, a, b, grad.dtype), transpose_kernel=True), None,
            weight_grad(x, d_xa).astype(a.dtype), weight_grad(xa, grad).astype(b.dtype))


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
        y = adapted_matmul(_input(self, x), *_adapted(self))
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class LoRAMLP(MLP):
    """The SwiGLU MLP of frozen kernels with low-rank updates (`adapted_swiglu_mlp`); a projection that is
    not a target has a rank-0 update."""

    def __call__(self, x: jax.Array, norm: decoder.RMSNorm) -> jax.Array:
        return adapted_swiglu_mlp(_input(self.gate_proj, norm(x)),
                                  *map(_adapted, (self.gate_proj, self.up_proj, self.down_proj)))


def _input(p: nnx.Linear, x: jax.Array) -> jax.Array:
    """x in the projection's compute dtype, as nnx.Linear casts it."""
    return x.astype(p.dtype or jnp.result_type(x, p.kernel[...]))


def _adapted(p: nnx.Linear) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(kernel, A, scale B) of a LoRA projection; a plain one's update has rank 0."""
    if isinstance(p, LoRALinear):
        return p.kernel[...], p.lora_a[...], p.scale * p.lora_b[...]
    kernel = p.kernel[...]
    return kernel, jnp.zeros((p.in_features, 0), kernel.dtype), jnp.zeros((0, p.out_features), kernel.dtype)


@jax.custom_vjp
def adapted_swiglu_mlp(x: jax.Array, gate: tuple, up: tuple, down: tuple) -> jax.Array:
    """The SwiGLU MLP of `decoder.normed_swiglu_mlp`, of an already normalised x, whose projections are
    (kernel W, A, B) triples, each x (W + A B) as in `adapted_matmul`: the backward pass keeps x and the gate
    and up projections of x, and computes x's and the adapters' gradients only."""
    return adapted_matmul(jax.nn.silu(adapted_matmul(x, *gate)) * adapted_matmul(x, *up), *down)


@residuals_as_bits
def _adapted_swiglu_forward(x, gate, up, down):
    if any(projection[0].perturbed for projection in (gate, up, down)):
        raise ValueError("adapted_swiglu_mlp differentiates x and the adapters only: its kernels must be "
                         "frozen (a LoRA base under stop_gradient)")
    x, gate, up, down = jax.tree.map(lambda p: p.value, (x, gate, up, down),
                                     is_leaf=lambda p: hasattr(p, "perturbed"))
    g, u = dense(x, _merged(*gate, x.dtype)), dense(x, _merged(*up, x.dtype))
    return dense(jax.nn.silu(g) * u, _merged(*down, x.dtype)), (x, g, u, gate, up, down)


@residuals_from_bits
def _adapted_swiglu_backward(residuals, grad):
    x, g, u, gate, up, down = residuals
    adapted_backward = lambda inputs, projection, grad: _adapted_matmul_backward(
        (inputs, inputs @ projection[1].astype(inputs.dtype), *projection), grad)
    s = jax.nn.sigmoid(g)
    act = g * s
    d_hidden, _, *d_down = adapted_backward(act * u, down, grad)
    d_g = d_hidden * u * s * (1 + g * (1 - s))
    dx_gate, _, *d_gate = adapted_backward(x, gate, d_g)
    dx_up, _, *d_up = adapted_backward(x, up, d_hidden * act)
    return dx_gate + dx_up, (None, *d_gate), (None, *d_up), (None, *d_down)


adapted_swiglu_mlp.defvjp(_adapted_swiglu_forward, _adapted_swiglu_backward, symbolic_zeros=True)


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


class Layout(NamedTuple):
    """An adapter folder's layout: the name of its weights file (`CONFIG_FILE` beside it holds the settings),
    `write(adapter, config, base_model) -> (tensors, settings)` and its inverse
    `read(tensors, settings, source) -> (config, adapter)`, `source` naming the folder in errors."""

    weights_file: str
    write: Callable[[Params, LoRAConfig, str | None], tuple[dict[str, np.ndarray], dict]]
    read: Callable[[dict[str, np.ndarray], dict, str], tuple[LoRAConfig, Params]]


def _scope_jax_tensors(adapter: Params, config: LoRAConfig, base_model: str | None):
    if base_model is not None:
        raise ValueError("the scope_jax adapter layout records no base model; save with format='peft'")
    tensors = {".".join(str(k.key) for k in path): np.ascontiguousarray(jax.device_get(leaf))
               for path, leaf in jax.tree_util.tree_leaves_with_path(adapter)}
    return tensors, {"rank": config.rank, "alpha": config.alpha, "targets": list(config.targets)}


def _from_scope_jax(tensors: dict[str, np.ndarray], settings: dict, source: str):
    try:
        config = LoRAConfig(**settings)
    except TypeError as error:
        raise ValueError(f"{source}/{CONFIG_FILE} is not a scope_jax adapter's settings: {error}") from None
    adapter: dict = {}
    for key, value in tensors.items():
        *parents, leaf = key.split(".")
        node = adapter
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = jnp.asarray(value)
    return config, adapter


# peft names one layer's factor of one projection (A [rank, in], B [out, rank]) as
PEFT_KEY = "base_model.model.model.layers.{layer}.{owner}.{name}.lora_{factor}.weight"
_PEFT_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])\.weight")
PEFT_FACTORS = (("lora_a", "A"), ("lora_b", "B"))
# peft settings that change what an adapter computes, at the values that compute `LoRALinear`'s
# x W + (lora_alpha / r) (x A) B; peft's adapter_config.json holding any other value is refused.
PEFT_PLAIN = {"bias": "none", "use_rslora": False, "use_dora": False, "lora_bias": False,
              "fan_in_fan_out": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
              "layers_to_transform": None, "trainable_token_indices": None, "layer_replication": None,
              "alora_invocation_tokens": None, "target_parameters": None}


def _peft_tensors(adapter: Params, config: LoRAConfig, base_model: str | None):
    tensors = {}
    for owner, projections in adapter["layers"].items():
        for name, factors in projections.items():
            for ours, factor in PEFT_FACTORS:
                stacked = np.asarray(jax.device_get(factors[ours]))
                chex.assert_rank(stacked, 3)  # [layers, in, rank] or [layers, rank, out]: one adapter
                for layer, matrix in enumerate(stacked):
                    key = PEFT_KEY.format(layer=layer, owner=owner, name=name, factor=factor)
                    tensors[key] = np.ascontiguousarray(matrix.T)
    alpha = int(config.alpha) if float(config.alpha).is_integer() else config.alpha
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
                "r": config.rank, "lora_alpha": alpha, "target_modules": list(config.targets),
                "lora_dropout": 0.0, "inference_mode": True, **PEFT_PLAIN}
    return tensors, settings


def _from_peft(tensors: dict[str, np.ndarray], settings: dict, source: str):
    if settings.get("peft_type") != "LORA":
        raise ValueError(f"{source}/{CONFIG_FILE} has peft_type {settings.get('peft_type')!r}, not 'LORA'")
    for key, plain in PEFT_PLAIN.items():
        value = settings.get(key, plain)
        if value != plain and (value or plain):  # None, False, {} and [] all say "not used"
            raise ValueError(f"{source}/{CONFIG_FILE} sets {key} = {value!r}; only {plain!r} loads")
    if not {"r", "lora_alpha"} <= settings.keys():
        raise ValueError(f"{source}/{CONFIG_FILE} lacks r or lora_alpha")
    found: dict = {}  # name -> factor -> layer -> matrix
    for key, value in tensors.items():
        match = _PEFT_KEY.fullmatch(key)
        if not match or match[3] not in ATTENTION_TARGETS + MLP_TARGETS or match[2] != _owner(match[3]):
            raise ValueError(f"{source}: tensor {key!r} is not a LoRA factor of a decoder layer's projection")
        found.setdefault(match[3], {}).setdefault(match[4], {})[int(match[1])] = value
    if not found:
        raise ValueError(f"{source}: {PEFT_ADAPTER_FILE} holds no LoRA factor")
    layers = list(range(1 + max(i for by_factor in found.values() for by_layer in by_factor.values()
                                for i in by_layer)))
    targets = tuple(t for t in ATTENTION_TARGETS + MLP_TARGETS if t in found)
    adapter: dict = {}
    for name in targets:
        if any(sorted(found[name].get(factor, {})) != layers for _, factor in PEFT_FACTORS):
            raise ValueError(f"{source}: {name} lacks lora_A or lora_B in some of layers 0..{layers[-1]}")
        factors = {ours: np.stack([found[name][factor][i].T for i in layers])
                   for ours, factor in PEFT_FACTORS}
        if factors["lora_a"].shape[-1] != settings["r"]:
            raise ValueError(f"{source}: {name}'s lora_A has rank {factors['lora_a'].shape[-1]}, not r = "
                             f"{settings['r']}")
        adapter.setdefault(_owner(name), {})[name] = {k: jnp.asarray(v) for k, v in factors.items()}
    config = LoRAConfig(rank=settings["r"], alpha=float(settings["lora_alpha"]), targets=targets)
    return config, {"layers": adapter}


LAYOUTS = {
    # this project's: keys "layers.self_attn.q_proj.lora_a", ..., [layers, in, rank] and [layers, rank, out]
    "scope_jax": Layout(ADAPTER_FILE, _scope_jax_tensors, _from_scope_jax),
    # peft's (transformers, vLLM): one [rank, in] / [out, rank] tensor per layer, keys `PEFT_KEY`
    "peft": Layout(PEFT_ADAPTER_FILE, _peft_tensors, _from_peft),
}


def save_adapter(folder: str | os.PathLike, adapter: Params, config: LoRAConfig, *, format: str = "scope_jax",
                 base_model: str | None = None) -> None:
    """Write `adapter` and `config` in `folder` in the layout `LAYOUTS[format]`, replacing an adapter saved
    there in any layout. base_model: peft's `base_model_name_or_path` (e.g. a hub id), peft layout only."""
    from safetensors.numpy import save_file

    if format not in LAYOUTS:
        raise ValueError(f"adapter format {format!r} is not one of {sorted(LAYOUTS)}")
    layout = LAYOUTS[format]
    tensors, settings = layout.write(adapter, config, base_model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for other in LAYOUTS.values():
        (folder / other.weights_file).unlink(missing_ok=True)
    save_file(tensors, str(folder / layout.weights_file), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def adapter_weights_file(folder: str | os.PathLike) -> Path:
    """The weights file of the adapter saved in `folder`, whose name says its layout (`LAYOUTS`)."""
    folder = Path(folder)
    found = [folder / layout.weights_file for layout in LAYOUTS.values()
             if (folder / layout.weights_file).is_file()]
    names = " or ".join(layout.weights_file for layout in LAYOUTS.values())
    if not found or not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not an adapter folder: it needs {CONFIG_FILE} and {names}")
    if len(found) > 1:
        raise ValueError(f"{folder} holds {' and '.join(f.name for f in found)}: which adapter is ambiguous")
    return found[0]


def adapter_sha256(folder: str | os.PathLike) -> str:
    """The sha256 of the weights file of the adapter saved in `folder`: which adapter a result came from."""
    return hashlib.sha256(adapter_weights_file(folder).read_bytes()).hexdigest()


def load_adapter(folder: str | os.PathLike) -> tuple[LoRAConfig, Params]:
    """(its LoRAConfig, the adapter dict) of a folder written by `save_adapter` in either layout, or by
    peft's `save_pretrained` (a plain LoRA on a decoder's projections)."""
    weights = adapter_weights_file(folder)
    try:
        settings = json.loads((weights.parent / CONFIG_FILE).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{weights.parent / CONFIG_FILE} is not JSON: {error}") from None
    layout = next(layout for layout in LAYOUTS.values() if layout.weights_file == weights.name)
    tensors = {key: np.array(value) for key, value in read_safetensors(weights).items()}  # copies, not mmaps
    return layout.read(tensors, settings, str(weights.parent))


def load(folder: str | os.PathLike, graphdef: nnx.GraphDef,
         params: Params) -> tuple[nnx.GraphDef, LoRAParams]:
    """The adapter saved in `folder` (either layout) on the plain model (graphdef, params); shapes are
    checked, and the adapter takes the dtype a fresh adapter of this model has (a float32 adapter on a
    bfloat16 base)."""
    config, adapter = load_adapter(folder)
    lora_graphdef, fresh = init(graphdef, params, config)
    expected = jax.tree.map(lambda x: x.shape, fresh.adapter)
    found = jax.tree.map(lambda x: x.shape, adapter)
    if expected != found:
        raise ValueError(f"the adapter in {folder} does not fit this model: {found} != {expected}")
    return lora_graphdef, fresh._replace(adapter=jax.tree.map(lambda x, f: x.astype(f.dtype), adapter,
                                                              fresh.adapter))
