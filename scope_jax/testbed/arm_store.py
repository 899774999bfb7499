"""Finished arms in the run directory (`arms/NAME.msgpack`) and their records in metrics.jsonl, so that a
resumed run reruns only the arms that did not finish and keeps each arm's records exactly once (an arm
whose records are incomplete, from a run killed while logging, has them dropped and logged again from
its saved result).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import serialization

from scope_jax.training.run_dir import RunDir, RunDirError, write_whole

ARMS_DIR = "arms"


@dataclasses.dataclass
class ArmResult:
    """Per-step curves [R, steps] (step t = 1..steps) and exact evaluations [R, E + 1]
    (steps 0, k, 2k, ...)."""

    label: str
    step_curves: dict[str, np.ndarray]
    eval_steps: np.ndarray
    evals: dict[str, np.ndarray]
    seconds: float

    @property
    def records(self) -> int:
        """How many metrics.jsonl records logging this arm writes."""
        return (self.step_curves["reward"].shape[1] if self.step_curves else 0) + len(self.eval_steps)


def save_tree(path, tree: dict) -> None:
    """A tree of arrays and strings to msgpack at path (an arm, and the run's pretrained and fitted
    models), written atomically (a killed run leaves the old file or the new one, never half of one)."""
    write_whole(path, serialization.msgpack_serialize(
        jax.tree.map(lambda x: x if isinstance(x, str) else np.asarray(x), tree)))


def restore_tree(path) -> dict:
    """What `save_tree` wrote at path; a file that does not unpack is a RunDirError naming it."""
    try:
        return serialization.msgpack_restore(path.read_bytes())
    except ValueError as e:  # msgpack's unpack errors
        raise RunDirError(f"{path} is unreadable ({type(e).__name__}: {e}); delete it, and the run computes "
                          "it again") from e


def log_arm(name: str, result: ArmResult, seeds: Sequence[int], log: Callable) -> None:
    """Every curve point of a finished arm: one record per step, then one per evaluation."""
    per_seed = lambda curves, i: {f"{k}/seed{s}": float(v[r, i]) for k, v in curves.items()
                                  for r, s in enumerate(seeds)}
    steps = result.step_curves["reward"].shape[1] if result.step_curves else 0
    for t in range(steps):
        log(name, t + 1, per_seed(result.step_curves, t))
    for e, step in enumerate(result.eval_steps):
        log(name, int(step), per_seed(result.evals, e))


class ArmStore:
    """Finished arms in the run directory, and their records in metrics.jsonl."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self.folder = run_dir.path / ARMS_DIR
        self.folder.mkdir(exist_ok=True)

    def load(self, name: str) -> ArmResult | None:
        path = self.folder / f"{name}.msgpack"
        if not path.exists():
            return None
        d = restore_tree(path)
        return ArmResult(str(d["label"]), dict(d["step_curves"] or {}), np.asarray(d["eval_steps"]),
                         dict(d["evals"]), float(d["seconds"]))

    def save(self, name: str, result: ArmResult) -> None:
        if self.run_dir.primary:
            save_tree(self.folder / f"{name}.msgpack", dataclasses.asdict(result))

    def logged(self, finished: dict[str, ArmResult]) -> set[str]:
        """The finished arms whose records are all in metrics.jsonl; every other arm's records are dropped."""
        records = self.run_dir.read_metrics()
        arm_of = lambda record: next(k for k in record if k != "step").split("/", 1)[0]
        counts: dict[str, int] = {}
        for record in records:
            counts[arm_of(record)] = counts.get(arm_of(record), 0) + 1
        complete = {name for name, result in finished.items() if counts.get(name) == result.records}
        self.run_dir.keep_metrics(lambda record: arm_of(record) in complete, records)
        return complete
