"""One directory per run: config, metrics (jsonl + tensorboard), figures, summary.

A run directory is *finished* once `summary.md` exists. Opening a finished directory again is refused
unless the caller asks to overwrite it, so a completed run's outputs are never lost by accident.
An unfinished directory can be reopened (that is how a killed run resumes); `metrics.jsonl` is then
appended to, after dropping the records the run will log again (`keep_metrics`: those at or beyond the
step it resumes from, all of them when no checkpoint was written; the tensorboard events are rewritten
from the records kept, so no step appears twice).

In a multi-host job every process opens the same directory (orbax checkpoints need all of them), but
only process 0 writes files, and only it removes a run that --overwrite replaces, before the others go
on; the others' writes are no-ops. The files the others read (the config, the pinned records) are
written whole or not at all, and a resumed run leaves them as they are: a process that read a
half-written config would stop with an error the others never meet.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

import numpy as np

T = TypeVar("T")

SUMMARY = "summary.md"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
TENSORBOARD = "tensorboard"
ADAPTERS = "adapters.json"  # {base+adapter spec: the sha256 of its weights file} of the models a run loads


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked."""


def write_whole(file: pathlib.Path, data: str | bytes) -> None:
    """Replace `file` by `data` in one step: a reader, or a process killed meanwhile, leaves the old file
    or the new one, never a part."""
    tmp = file.with_name(f".{file.name}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, file)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _to_builtin(value: Any) -> Any:
    """numpy / jax scalars and arrays -> plain Python, NaN/inf kept as floats (json writes them)."""
    if isinstance(value, Mapping):
        return {str(k): _to_builtin(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_builtin(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and jax arrays / scalars
        return _to_builtin(np.asarray(value).tolist())
    return value


class RunDir:
    """Writes everything a run produces into `path`.

    Use as a context manager so the tensorboard writer is flushed and closed::

        with RunDir.create(path, config) as run:
            for step in run.progress(range(n), desc="train"):
                run.log(step, {"reward": r})
            run.write_summary("# Result ...")
    """

    def __init__(self, path: pathlib.Path):
        import jax

        self.path = path
        self.primary = jax.process_index() == 0
        self.figures = path / "figures"
        self.figures.mkdir(parents=True, exist_ok=True)
        self._tb = None

    @classmethod
    def create(cls, path: str | pathlib.Path, config: Any, *, overwrite: bool = False) -> "RunDir":
        """Open `path` for a run of `config` (an ml_collections ConfigDict or a mapping).

        A finished run is refused unless `overwrite`; an unfinished one must hold the same config.
        """
        import jax
        from jax.experimental import multihost_utils

        path = pathlib.Path(path)
        config_json = json.dumps(_to_builtin(config.to_dict() if hasattr(config, "to_dict") else config),
                                 indent=2, sort_keys=True)
        if (path / SUMMARY).exists():
            if not overwrite:
                raise RunDirError(f"{path} holds a finished run; "
                                  "pass --overwrite or choose another --workdir")
            replaced = True
        else:
            began = (path / CONFIG).read_text() if (path / CONFIG).exists() else config_json
            replaced = began != config_json
            if replaced and not overwrite and not _is_json(began):
                raise RunDirError(f"{path / CONFIG} is damaged (not JSON); restore it to resume the run, or "
                                  "pass --overwrite to discard the run")
            if replaced and not overwrite:
                raise RunDirError(f"{path} holds an unfinished run of another config; pass --overwrite or "
                                  "choose another --workdir")
        if replaced and jax.process_index() == 0:
            shutil.rmtree(path)
        if jax.process_count() > 1:  # no process makes a folder in the directory before it is cleared
            multihost_utils.sync_global_devices(f"RunDir.create {path}")
        path.mkdir(parents=True, exist_ok=True)
        run_dir = cls(path)
        if run_dir.primary and not (path / CONFIG).exists():
            write_whole(path / CONFIG, config_json)
        return run_dir

    def pin(self, name: str, record: Mapping[str, Any]) -> None:
        """Write `record` to the json file `name`, which a resumed run must find unchanged: what it names
        (e.g. an adapter's bytes) must be what the run began with."""
        text = json.dumps(_to_builtin(record), indent=1, sort_keys=True) + "\n"
        file = self.path / name
        if file.exists():
            began = file.read_text()
            if began != text:
                raise RunDirError(f"{file} no longer matches this run: it began with {json.loads(began)}, "
                                  f"now {dict(record)}; restore what changed or choose another --workdir")
        elif self.primary:
            write_whole(file, text)

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tensorboard(self):
        if self._tb is None:
            from tensorboardX import SummaryWriter

            # events files are named by the second they open in: a unique suffix keeps a writer reopened
            # within the same second from replacing the last one's file
            self._tb = SummaryWriter(str(self.path / TENSORBOARD), filename_suffix=f".{time.time_ns()}")
        return self._tb

    def keep_metrics(self, keep: Callable[[dict[str, Any]], bool],
                     records: list[dict[str, Any]] | None = None) -> None:
        """Keep the records `keep` accepts, in metrics.jsonl and in the tensorboard events (rewritten from
        the records kept): a resumed run logs the others again. `records`: `read_metrics()`, where the
        caller has read it already."""
        if not self.primary or not (self.path / METRICS).exists():
            return
        kept = [record for record in (self.read_metrics() if records is None else records) if keep(record)]
        write_whole(self.path / METRICS, "".join(json.dumps(record) + "\n" for record in kept))
        self.close()
        shutil.rmtree(self.path / TENSORBOARD, ignore_errors=True)
        for record in kept:
            self._scalars(record)

    def log(self, step: int, metrics: Mapping[str, Any], *, prefix: str = "") -> None:
        """Append one record to metrics.jsonl and write scalars to tensorboard."""
        if not self.primary:
            return
        metrics = _to_builtin(metrics)
        record = {"step": int(step), **{prefix + k: v for k, v in metrics.items()}}
        with open(self.path / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")
        self._scalars(record)

    def _scalars(self, record: Mapping[str, Any]) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tensorboard.add_scalar(key, value, int(record["step"]))

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl. A last line that is not a whole record, as a process stopped while
        writing it leaves, is left out with a warning; any other such line is an error that names it."""
        file = self.path / METRICS
        if not file.exists():
            return []
        lines = [(n, line) for n, line in enumerate(file.read_text().splitlines(), 1) if line.strip()]
        records = []
        for n, line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                if n != lines[-1][0]:
                    raise RunDirError(f"{file} line {n} is not a JSON record ({e}); mend or delete it") from e
                print(f"warning: {file} ends in a line that is not a whole record ({len(line)} characters); "
                      "it is left out", file=sys.stderr)
        return records

    def figure_path(self, name: str) -> pathlib.Path:
        return self.figures / (name if name.endswith(".png") else name + ".png")

    def save_figure(self, fig, name: str) -> pathlib.Path:
        """Save a matplotlib figure as PNG under figures/ and close it."""
        import matplotlib.pyplot as plt

        out = self.figure_path(name)
        if self.primary:
            fig.savefig(out, dpi=120, bbox_inches="tight")
        plt.close(fig)
        return out

    def write_text(self, name: str, text: str) -> pathlib.Path:
        """Write the file `name` (a path inside the run directory; folders are made) from process 0."""
        out = self.path / name
        if self.primary:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_whole(out, text)
        return out

    def write_json(self, name: str, obj: Any) -> pathlib.Path:
        return self.write_text(name, json.dumps(_to_builtin(obj), indent=2, sort_keys=True))

    def write_summary(self, markdown: str) -> pathlib.Path:
        """Write summary.md; this marks the run as finished."""
        out = self.path / SUMMARY
        if self.primary:
            write_whole(out, markdown.rstrip() + "\n")
        return out

    @staticmethod
    def progress(iterable: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
        """A tqdm bar over `iterable` (its set_postfix_str adds live figures such as tokens/s)."""
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, dynamic_ncols=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
