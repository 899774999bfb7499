"""Run an experiment: python -m experiments.run --config=experiments/configs/NAME.py[:ARG] [--config.k=v].

The config's `experiment` field names the job (a module in experiments/jobs/). The config is checked
against that job's defaults before any work starts, and what the check built (a dialogue RL run's
environment) goes to the job's run rather than being built again; the run writes into one directory
(--workdir, default runs/NAME-TIMESTAMP). Pointing --workdir at an unfinished run resumes it where the job
supports that; a finished run is only replaced with --overwrite.

A user's mistake, or a run that stops on purpose, ends with one line `error: ...` and exit status 1, no
traceback (see USER_ERRORS); anything else is a bug and keeps its traceback. A process of a multi-process
job leaves at once either way, so that none waits for it (`distributed.exit_with_error`).
"""

from __future__ import annotations

import datetime
import pathlib
import runpy
import sys
from types import ModuleType
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from experiments import jobs
from scope_jax import distributed
from scope_jax.config import ConfigError, validate
from scope_jax.dialogue.views import ViewError
from scope_jax.training.checkpoint import CheckpointError
from scope_jax.training.run_dir import RunDir, RunDirError
from scope_jax.training.train import TrainingStopped

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (with optional :ARG).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/NAME-TIMESTAMP).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a finished run in --workdir.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Multi-process job: join it first (coordinator and "
                                 "process ids from experiments.launch_local's environment, or Slurm's or a "
                                 "TPU VM's; see docs/distributed.md).")
flags.mark_flag_as_required("config")

# A bad config, run directory or checkpoint; a run stopped on purpose; a dialogue a view cannot follow.
USER_ERRORS = (ConfigError, RunDirError, CheckpointError, TrainingStopped, ViewError)


def default_workdir(config_arg: str) -> pathlib.Path:
    """runs/NAME-TIMESTAMP; every process of a multi-process job takes process 0's timestamp."""
    path, _, arg = config_arg.partition(":")
    name = pathlib.Path(path).stem + (f"-{arg}" if arg else "")
    stamp = distributed.gather(f"{datetime.datetime.now():%Y%m%d-%H%M%S}")[0]
    return pathlib.Path("runs") / f"{name}-{stamp}"


def prepare(config) -> tuple[ModuleType, Any]:
    """Validate and check `config`; returns its job module and what the job's check built (None: nothing),
    for its run. Raises ConfigError with one line naming the key."""
    if "experiment" not in config:
        raise ConfigError("config key 'experiment' is missing (it names the job to run)")
    job = jobs.load(config.experiment)
    validate(config, job.schema(config) if hasattr(job, "schema") else job.default_config())
    return job, job.check(config) if hasattr(job, "check") else None


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if _DISTRIBUTED.value:
        distributed.initialize()
    config = _CONFIG.value
    try:
        job, checked = prepare(config)
    except USER_ERRORS as e:
        distributed.exit_with_error(str(e), on_every_process=True)  # the same config, the same checks
    try:
        workdir = pathlib.Path(_WORKDIR.value) if _WORKDIR.value else default_workdir(_config_spec())
        run_dir = RunDir.create(workdir, config, overwrite=_OVERWRITE.value)
        print(f"run directory: {run_dir.path}")
        with run_dir:
            if checked is None:
                job.run(config, run_dir)
            else:
                job.run(config, run_dir, checked)  # what the check built, not built again
    except USER_ERRORS as e:
        distributed.exit_with_error(str(e))
    print(f"done: {run_dir.path}")


def _config_spec() -> str:
    return config_flags.get_config_filename(flags.FLAGS["config"])


def _unknown_override(argv: list[str]) -> str | None:
    """The first --config.KEY=VALUE in argv whose KEY the config file does not define, if any (None also
    where the config file itself fails)."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is None:
        return None
    path, _, arg = spec.partition(":")
    try:
        module = runpy.run_path(path)
        config = module["get_config"](arg) if arg else module["get_config"]()
    except Exception:  # the config file's own error, which the caller reports
        return None
    for a in argv:
        if a.startswith("--config."):
            key = a[len("--config."):].split("=", 1)[0]
            node = config
            for part in key.split("."):
                if not hasattr(node, "keys") or part not in node:
                    return key
                node = node[part]
    return None


def _last_line(error: Exception) -> str:
    """An error's message, or for a config file that raised while loading, the error it raised (the last
    line of the traceback that the flag's message quotes), without its exception type."""
    text = str(error).strip()
    if "Traceback (most recent call last)" not in text:
        return text.splitlines()[0]
    return text.splitlines()[-1].split(": ", 1)[-1]


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with a missing config file, an argument the config file refuses, or a bad
    --config override reported in one line instead of a traceback."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is not None and not pathlib.Path(spec.partition(":")[0]).is_file():
        sys.exit(f"error: config file {spec.partition(':')[0]} does not exist")
    try:
        argv = flags.FLAGS(argv)
    except flags.Error as e:
        sys.exit(f"error: {_last_line(e)}")
    except Exception as e:  # an override the config does not take, or a config file that fails to load
        key = _unknown_override(argv)
        sys.exit(f"error: unknown config key '{key}'" if key else f"error: {_last_line(e)}")
    return argv


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
