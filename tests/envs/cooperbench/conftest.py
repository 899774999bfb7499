"""Shared fixtures: one suite task, a breakable copy of it, and an evaluator whose gold counts are measured
once per session."""

import shutil

import pytest

from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import load_task

TASK = "commands"  # both features append to one file: the gold merge needs the union step


@pytest.fixture(scope="session")
def task():
    return load_task(SUITE_DIR / TASK)


@pytest.fixture
def task_copy(tmp_path):
    """A writable copy of the task folder (to break on purpose), under tmp_path/tasks/."""
    destination = tmp_path / "tasks" / TASK
    shutil.copytree(SUITE_DIR / TASK, destination)
    return destination


@pytest.fixture(scope="session")
def evaluator():
    repos = Repos()
    yield Evaluator(repos, isolation="process")
    repos.close()
