"""Files of the tau2 data folder (`../shared/data/tau2`): each read once, errors naming the file (not a
config key: the job that catches one names its own).

Layout: domains/NAME/{policy.md, db.json, user_db.json (mock only), tasks.json, split_tasks.json} and
user_simulator/simulation_guidelines[_tools].md.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from scope_jax.envs.tau2.tasks import Task, Tau2DataError, parse_task

DEFAULT_DATA_DIR = "../shared/data/tau2"
GUIDELINES = "user_simulator/simulation_guidelines.md"
GUIDELINES_WITH_TOOLS = "user_simulator/simulation_guidelines_tools.md"


def domain_dir(data_dir: str | pathlib.Path, domain: str) -> pathlib.Path:
    path = pathlib.Path(data_dir) / "domains" / domain
    if not path.is_dir():
        raise Tau2DataError(f"tau2 domain folder {path} is missing")
    return path


def read_text(path: pathlib.Path) -> str:
    if not path.is_file():
        raise Tau2DataError(f"tau2 data file {path} is missing")
    return path.read_text(encoding="utf-8")


def read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise Tau2DataError(f"tau2 data file {path} is not valid JSON: {e}") from None


def read_tables(path: pathlib.Path) -> dict[str, dict[str, Any]]:
    """A database file: a JSON object of tables, each an object of records."""
    tables = read_json(path)
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise Tau2DataError(f"tau2 database {path} is not a JSON object of tables")
    return tables


def read_tasks(path: pathlib.Path) -> dict[str, Task]:
    """tasks.json as {task id: Task}, in file order."""
    records = read_json(path)
    if not isinstance(records, list):
        raise Tau2DataError(f"tau2 task file {path} is not a JSON list of tasks")
    tasks = {}
    for i, record in enumerate(records):
        task = parse_task(record, f"{path}, entry {i}")
        if task.id in tasks:
            raise Tau2DataError(f"tau2 task file {path} holds task {task.id} twice")
        tasks[task.id] = task
    return tasks


def read_splits(path: pathlib.Path, tasks: dict[str, Task]) -> dict[str, tuple[str, ...]]:
    """split_tasks.json as {split name: task ids}; every id must be a task of the domain."""
    splits = read_json(path)
    if not isinstance(splits, dict):
        raise Tau2DataError(f"tau2 split file {path} is not a JSON object of splits")
    for name, ids in splits.items():
        unknown = [str(i) for i in ids if str(i) not in tasks]
        if unknown:
            raise Tau2DataError(f"tau2 split file {path}: split {name!r} names unknown tasks "
                                f"{', '.join(unknown)}")
    return {name: tuple(str(i) for i in ids) for name, ids in splits.items()}
