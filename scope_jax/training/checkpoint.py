"""Orbax checkpoints of the whole training state plus the host loop's position.

Each checkpoint is one directory `<run_dir>/checkpoints/<step>/` with three items:

    state  the JointState (orbax StandardSave: OCDBT + zarr; restored straight onto the target shardings)
    host   a small JSON dict from the host loop: data position, numpy Generator state, counters
    meta   the config fingerprint and, per state leaf, its shape, dtype and a checksum of its bits

Orbax writes `<step>.orbax-checkpoint-tmp` and renames it when complete, so a run killed mid-save
leaves no checkpoint that `latest_step` returns; the stale temporary directory is removed when the
next Checkpointer opens the directory. Saving is blocking.

Restoring refuses, with one line naming the problem, a checkpoint written by another config, one whose
tree does not match the target state, and one that is unreadable or corrupt. The checksums exist
because orbax does not notice damaged bytes inside its zstd chunks: they restore as wrong numbers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import absl.logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax import lax

from scope_jax.sharding import path_string
from scope_jax.training.state import JointState

_GOLDEN = 0x9E3779B1  # odd, so the odd position weights below stay odd


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or restored as asked."""


def config_fingerprint(config: dict) -> str:
    """A stable hash of a JSON-able dict (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """Sum over elements of bits * odd position weight, mod 2**32.

    Integer addition is associative, so the value is exact on any sharding; odd weights are invertible
    mod 2**32, so changing any single element always changes the sum.
    """
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    elif x.dtype.itemsize < 4:
        bits = lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)
    else:
        bits = lax.bitcast_convert_type(x, jnp.uint32)  # 8-byte items gain a trailing axis of 2
    # Row-major element index built from iotas: a reshape(-1) would gather a sharded array.
    index = jnp.zeros(bits.shape, jnp.uint32)
    for axis, size in enumerate(bits.shape):
        index = index * jnp.uint32(size) + lax.broadcasted_iota(jnp.uint32, bits.shape, axis)
    weight = (index * jnp.uint32(2) + jnp.uint32(1)) * jnp.uint32(_GOLDEN)
    return jnp.sum(bits * weight, dtype=jnp.uint32)


_checksums = jax.jit(lambda tree: jax.tree.map(_leaf_checksum, tree))


def _leaf_records(state: JointState) -> dict[str, dict[str, Any]]:
    """{leaf path: {"shape", "dtype", "checksum"}} for a concrete state."""
    sums = jax.device_get(_checksums(state))
    return {path_string(path): {"shape": list(leaf.shape), "dtype": str(leaf.dtype), "checksum": int(total)}
            for (path, leaf), total in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(sums))}


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    text = text.split(" See full TensorStore details")[0]  # followed by a multi-line spec dump
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class _QuietOrbax(logging.Filter):
    """Drops orbax's INFO/DEBUG records (over a hundred lines per few saves under absl.app)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname.replace("\\", "/")


def _quiet_orbax_logging() -> None:
    absl_logger = absl.logging.get_absl_logger()
    if not any(isinstance(f, _QuietOrbax) for f in absl_logger.filters):
        absl_logger.addFilter(_QuietOrbax())


class Checkpointer:
    """Saves and restores (JointState, host dict) pairs under `directory`, keeping the newest `keep`.

    `fingerprint` (from `config_fingerprint`) is stored with every checkpoint; restoring one written
    under another fingerprint is refused. Use as a context manager or call `close()`.
    """

    def __init__(self, directory: str | Path, fingerprint: str, *, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        _quiet_orbax_logging()
        self.directory = Path(directory).absolute()
        self.fingerprint = fingerprint
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                               cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, None if there is none."""
        return self._manager.latest_step()

    def save(self, step: int, state: JointState, host: dict) -> None:
        """Write `state` (possibly sharded) and the JSON-able `host` dict as checkpoint `step`.

        Blocks until the checkpoint is complete; then only the newest `keep` checkpoints remain.
        `step` must be newer than every checkpoint already in the directory.
        """
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise CheckpointError(f"cannot save step {step}: {self.directory} already holds step {latest}")
        try:
            json.dumps(host)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"host state for step {step} is not JSON-serialisable: {e}") from e
        meta = {"fingerprint": self.fingerprint, "leaves": _leaf_records(state)}
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         host=ocp.args.JsonSave(host),
                                                         meta=ocp.args.JsonSave(meta)))

    def restore(self, abstract_state: JointState, step: int | None = None) -> tuple[JointState, dict]:
        """(state, host) of checkpoint `step` (default: the latest), arrays placed on the shardings of
        `abstract_state` (a JointState of jax.ShapeDtypeStruct with `.sharding` set).

        Raises CheckpointError if there is no such checkpoint, it was written by another config, its
        tree, shapes or dtypes differ from `abstract_state`, or it is unreadable or corrupt.
        """
        available = self._manager.all_steps()
        if not available:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        step = max(available) if step is None else step
        if step not in available:
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory} "
                                  f"(steps there: {sorted(available)})")
        meta = self._read(step, meta=ocp.args.JsonRestore()).meta
        if not isinstance(meta, dict) or not {"fingerprint", "leaves"} <= meta.keys():
            raise self._corrupt(step, "its meta item lacks the fingerprint or leaf records")
        if meta["fingerprint"] != self.fingerprint:
            raise CheckpointError(f"checkpoint at step {step} in {self.directory} was written by "
                                  f"another config (fingerprint {meta['fingerprint']} != {self.fingerprint});"
                                  f" delete {self.directory} to start the run over, or use a new --workdir")
        self._check_tree(step, meta["leaves"], abstract_state)
        restored = self._read(step, state=ocp.args.StandardRestore(abstract_state),
                              host=ocp.args.JsonRestore())
        records = _leaf_records(restored.state)
        damaged = [path for path, record in records.items()
                   if record["checksum"] != meta["leaves"][path]["checksum"]]
        if damaged:
            more = f" and {len(damaged) - 1} more leaves" if len(damaged) > 1 else ""
            raise self._corrupt(step, f"checksum mismatch in {damaged[0]}{more}")
        return restored.state, restored.host

    def close(self) -> None:
        """Wait for pending work and release orbax's resources."""
        self._manager.close()

    def _read(self, step: int, **items: ocp.args.CheckpointArgs) -> ocp.args.Composite:
        try:
            return self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # orbax / tensorstore raise many types for damaged files; one message for all
            raise self._corrupt(step, _first_line(e)) from e

    def _corrupt(self, step: int, reason: str) -> CheckpointError:
        return CheckpointError(f"checkpoint at step {step} in {self.directory} is unreadable or corrupt "
                               f"({reason}); delete that step directory to resume from an earlier checkpoint")

    def _check_tree(self, step: int, saved: dict[str, dict[str, Any]], abstract_state: JointState) -> None:
        """Refuse a checkpoint whose leaves (paths, shapes, dtypes) differ from `abstract_state`'s."""
        target = {path_string(path): leaf
                  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)}
        problems = [f"it lacks {path}" for path in target if path not in saved]
        problems += [f"it has {path}, the state does not" for path in saved if path not in target]
        for path in target.keys() & saved.keys():
            want = (list(target[path].shape), str(target[path].dtype))
            have = (saved[path]["shape"], saved[path]["dtype"])
            if have != want:
                problems.append(f"{path} is {have[1]}{tuple(have[0])}, "
                                f"the state wants {want[1]}{tuple(want[0])}")
        if problems:
            more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
            raise CheckpointError(f"checkpoint at step {step} in {self.directory} does not match the state: "
                                  f"{sorted(problems)[0]}{more}")
