"""The processes of a multi-controller job: which shards of a step's work each plays, and how their results
meet.

Every process of a multi-host job runs the same program (JAX's multi-controller runtime). A step's work
(its scenario groups, evaluation groups, monitor probes) is cut into `Shards.count` contiguous blocks;
process p of P plays the shards [p S/P, (p+1) S/P), shard s with the key `fold_in(key, s)`. What a shard
plays depends on (seed, step, s) only, not on how many processes share the shards, so a 1-process run
with the same shard count plays the very same episodes (its shards one after the other).

Their results meet in two ways:
  `global_rows`  each process's rows of a batch become one array on the global mesh (no copy between
                 hosts; the jitted train step then runs as one program over every device);
  `gather`       small Python objects (a step's episodes, probe results) are copied to every process, so
                 statistics are computed over all of them, the same on every process.

A process's rollouts run on `local_mesh`, its own devices of the global mesh, with `local_view`s of the
parameters: the devices of one process must hold whole model replicas (mesh.fsdp x mesh.tensor devices
within a process; the data axis spans the processes).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from typing import Any, Callable, NoReturn, Sequence, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from scope_jax import sharding

T, R = TypeVar("T"), TypeVar("R")

# Set by experiments.launch_local for each process it starts (unset: the cluster's environment decides).
COORDINATOR, PROCESSES, PROCESS_ID = "SCOPE_JAX_COORDINATOR", "SCOPE_JAX_PROCESSES", "SCOPE_JAX_PROCESS_ID"
HEARTBEAT_TIMEOUT_S = 60  # a process that stops answering is declared lost after this long


def initialize() -> None:
    """`jax.distributed.initialize` with the coordinator and process ids of experiments.launch_local's
    environment when it is set, else from Slurm's or a TPU VM's (JAX detects those). CPU collectives go
    through gloo (XLA:CPU has no others). From here an exception nothing catches ends the process as
    `exit_with_error` does, after its traceback.

    The processes then meet in one collective while they are still in step: on the CPU it builds the gloo
    context, whose creation fails when one process reaches the first collective more than 30 s after
    another (XLA's fixed key-value timeout); later collectives wait as long as they need."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if COORDINATOR in os.environ:
        jax.distributed.initialize(os.environ[COORDINATOR], int(os.environ[PROCESSES]),
                                   int(os.environ[PROCESS_ID]), heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    else:
        jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    sys.excepthook = _leaving_at_once(sys.excepthook)
    multihost_utils.sync_global_devices("scope_jax.distributed.initialize")


def _leaving_at_once(excepthook: Callable[..., None]) -> Callable[..., None]:
    """`excepthook` (which prints the traceback), then `_leave`: see `exit_with_error`."""
    def leave(*exc_info) -> None:
        excepthook(*exc_info)
        _leave()

    return leave


def _leave() -> NoReturn:
    """Exit with status 1 now, what was printed flushed, skipping atexit (JAX's shutdown barrier)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def exit_with_error(message: str, *, on_every_process: bool = False) -> NoReturn:
    """End this process with `error: message` on stderr and exit status 1.

    A process of a multi-process job leaves at once (`os._exit`), without JAX's shutdown barrier: the
    others may be waiting in a collective this process will never join, and the barrier would wait for
    them, so the job would hang. They are then stopped by experiments.launch_local, or on a cluster by the
    coordination service after HEARTBEAT_TIMEOUT_S. The line names the process (`error: process 1 of 2:
    ...`), except that process 0 alone says an error every process meets alike (`on_every_process`: a
    refused config). Such an error the processes leave together, through JAX's shutdown barrier: process 0
    hosts the coordination service, and a process still on its way to the error when the service went
    away would be aborted by it."""
    if jax.process_count() == 1:
        sys.exit(f"error: {message}")
    process = jax.process_index()
    if process == 0:
        print(f"error: {message}", file=sys.stderr)
    elif not on_every_process:
        print(f"error: process {process} of {jax.process_count()}: {message}", file=sys.stderr)
    if on_every_process:
        sys.stderr.flush()
        jax.distributed.shutdown()
    _leave()


@dataclasses.dataclass(frozen=True)
class Shards:
    """`count` shards of a step's work over `processes` processes; this is process `process`."""

    count: int
    processes: int = dataclasses.field(default_factory=jax.process_count)
    process: int = dataclasses.field(default_factory=jax.process_index)

    def __post_init__(self):
        if self.count % self.processes:
            raise ValueError(f"{self.count} shards do not split over {self.processes} processes")

    def mine(self) -> range:
        """The shards this process plays."""
        per = self.count // self.processes
        return range(self.process * per, (self.process + 1) * per)

    def items(self, shard: int, n: int) -> range:
        """The indices of shard `shard`'s items among `n` (n must divide into the shards)."""
        if n % self.count:
            raise ValueError(f"{n} items do not split into {self.count} shards")
        per = n // self.count
        return range(shard * per, (shard + 1) * per)

    def run(self, items: Sequence[T], key: jax.Array,
            play: Callable[[list[T], jax.Array], list[R]]) -> list[R]:
        """`play(shard's items, fold_in(key, shard))` for each of this process's shards, results joined."""
        return [result for shard in self.mine()
                for result in play([items[i] for i in self.items(shard, len(items))],
                                   jax.random.fold_in(key, shard))]


def refusal(what: str, n: int, shards: int, processes: int) -> str | None:
    """Why `n` items of `what` cannot be shared by `shards` shards over `processes` processes, or None."""
    if shards % processes:
        return f"{shards} shards do not split over {processes} processes"
    if n % shards:
        return f"{n} {what} do not split into {shards} shards"
    return None


def gather(obj: Any) -> list[Any]:
    """`obj` of every process, in process order (each process gets the whole list)."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).ravel()
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    blobs = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(blob[:size].tobytes()) for blob, size in zip(blobs, sizes)]


def concatenated(objects: Sequence[Any]) -> list[Any]:
    """The lists of every process, `gather`ed and joined in process order."""
    return [item for part in gather(list(objects)) for item in part]


def agreed_max(value: int) -> int:
    """The largest `value` over the processes (a padded length every process uses)."""
    return max(gather(int(value)))


def local_mesh(mesh: Mesh) -> Mesh:
    """This process's devices of `mesh`: the block of its data axis they fill (the whole mesh in a
    1-process run)."""
    if jax.process_count() == 1:
        return mesh
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(mesh.devices)
    rows = np.flatnonzero(mine.any(axis=(1, 2)))
    if not mine[rows].all() or mine.sum() != len(rows) * mine[0].size:
        raise ValueError(f"mesh {dict(mesh.shape)} splits a model replica (mesh.fsdp x mesh.tensor devices) "
                         "between processes; each process's devices must hold whole replicas")
    return Mesh(mesh.devices[rows], mesh.axis_names, axis_types=mesh.axis_types)


def local_view(tree: Any, mesh: Mesh) -> Any:
    """`tree`'s arrays (on a global mesh whose local part is `mesh`, replicated over its data axis) as
    arrays on `mesh` made of this process's shards, without a copy."""
    if jax.process_count() == 1:
        return tree

    def view(x: jax.Array) -> jax.Array:
        local = NamedSharding(mesh, x.sharding.spec)
        shards = [s.data for s in x.addressable_shards]
        return jax.make_array_from_single_device_arrays(x.shape, local, shards)

    return jax.tree.map(view, tree)


def global_rows(tree: Any, mesh: Mesh, axis: int = 0) -> Any:
    """Each process's rows (axis `axis` of every array in `tree`, the same shapes on each process) as one
    global array on `mesh`, that axis split over its (data, fsdp) axes, process p's rows at block p."""
    def rows(x) -> jax.Array:
        x = np.asarray(x)
        shape = x.shape[:axis] + (x.shape[axis] * jax.process_count(),) + x.shape[axis + 1:]
        return jax.make_array_from_process_local_data(sharding.batch_sharding(mesh, x.ndim, axis), x, shape)

    return jax.tree.map(rows, tree)
