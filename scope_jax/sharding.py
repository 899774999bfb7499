"""Meshes and partition rules: how parameter and batch arrays are laid out over devices.

A mesh has the named axes ("data", "fsdp", "tensor"). Parameters are placed by *rules*: a list of
(regex over the parameter's path such as "layers/self_attn/q_proj/kernel", PartitionSpec); the first
rule that matches wins, and a mesh axis is dropped from a dimension it does not divide, so one rule set
serves every model size and mesh shape. Batches are split over ("data", "fsdp") on their first axis.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
Rules = Sequence[tuple[str, P]]


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with Auto axis types over the first data*fsdp*tensor devices.

    -1 in one axis takes all remaining devices.
    """
    devices = list(devices if devices is not None else jax.devices())
    shape = [data, fsdp, tensor]
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {shape}")
    if -1 in shape:
        rest = int(np.prod([s for s in shape if s != -1]))
        shape[shape.index(-1)] = len(devices) // rest
    size = int(np.prod(shape))
    if size > len(devices) or size < 1:
        raise ValueError(f"mesh {dict(zip(AXES, shape))} needs {size} devices; {len(devices)} are available")
    grid = np.asarray(devices[:size]).reshape(shape)
    return Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES))


def path_string(path: tuple) -> str:
    """'layers/self_attn/q_proj/kernel' for a pytree key path."""
    parts = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
        parts.append(str(name))
    return "/".join(parts)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """Drop mesh axes from dimensions they do not divide (and axes beyond the array's rank)."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        names = tuple(a for a in names if a in mesh.shape)
        fitted.append(names if names and dim % int(np.prod([mesh.shape[a] for a in names])) == 0 else None)
    return P(*[(n[0] if len(n) == 1 else n) if n else None for n in fitted])


def partition_specs(tree: Any, rules: Rules, mesh: Mesh) -> Any:
    """PartitionSpec per leaf of `tree` (arrays or ShapeDtypeStructs), from the first matching rule."""
    compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

    def spec_for(path, leaf):
        name = path_string(path)
        spec = next((s for pattern, s in compiled if pattern.search(name)), P())
        return _fit(spec, tuple(leaf.shape), mesh)

    return jax.tree_util.tree_map_with_path(spec_for, tree)


def named_shardings(tree: Any, rules: Rules, mesh: Mesh) -> Any:
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), partition_specs(tree, rules, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, rank: int, axis: int = 0) -> NamedSharding:
    """Dimension `axis` (the batch) over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, P(*[BATCH_AXES if d == axis else None for d in range(rank)]))


def data_parallel_size(mesh: Mesh) -> int:
    """How many shards a batch dimension is split into: the size of the (data, fsdp) axes."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def place(tree: Any, shardings: Any) -> Any:
    """`tree`'s arrays on `shardings`, each process writing its own shards from its host copy of the
    values (which must be the same on every process). Unlike `jax.device_put`, this also builds arrays
    whose devices span several processes; an array already on its target sharding is kept."""
    def put(x, target: jax.sharding.Sharding) -> jax.Array:
        if isinstance(x, jax.Array) and x.sharding == target:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, target, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
