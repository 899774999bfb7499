"""CooperBench tasks on disk: the real dataset's layout, which our own suite (suite/) uses too.

A task folder holds
  feature{N}/feature.md      the feature's spec: all an agent is shown of it
  feature{N}/feature.patch   the gold implementation (a git diff, source files only)
  feature{N}/tests.patch     the hidden tests (a git diff, usually adding tests to an existing test file)
  combined.patch             one joint gold solution of all the task's features
  run_tests.sh               the test command: `bash run_tests.sh REPO TESTS_PATCH [FEATURE_PATCH]` applies
                             the feature patch, then the tests patch, to the git checkout REPO (upstream
                             scripts first run `git reset --hard` and `git clean -fd` there) and runs the
                             task's tests (exit status 0 = pass, pytest's summary line)
  repo.bundle or repo/       the upstream repository offline, at the base commit: a git bundle whose HEAD
                             is the base commit, or a checkout (with .git: its HEAD; a plain file tree: the
                             tree itself is the base)
The dataset's other files (Dockerfile, setup.sh, runner.sh) are not used. A task's name is its path under
the folder it was loaded from (e.g. `pallets_jinja_task/task1621`). A malformed folder raises
TaskFormatError, one line naming the missing or broken file.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
import re

FEATURE_DIR = re.compile(r"feature(\d+)")
BUNDLE, CHECKOUT = "repo.bundle", "repo"
BUNDLE_SIGNATURES = (b"# v2 git bundle", b"# v3 git bundle")
DIFF_HEADER = re.compile(r"^diff --git a/\S+ b/\S+$", re.MULTILINE)


class TaskFormatError(ValueError):
    """A task folder lacks a file, or a file is not what the layout says."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a task: its id (N of feature{N}), spec, gold patch and hidden-tests patch."""

    id: int
    spec: str
    patch: str
    tests_patch: str


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    path: pathlib.Path
    features: tuple[Feature, ...]  # by id
    combined_patch: str

    @property
    def run_tests(self) -> pathlib.Path:
        return self.path / "run_tests.sh"

    @property
    def repo_source(self) -> pathlib.Path:
        """repo.bundle if present, else repo/."""
        bundle = self.path / BUNDLE
        return bundle if bundle.exists() else self.path / CHECKOUT

    def feature(self, feature_id: int) -> Feature:
        for feature in self.features:
            if feature.id == feature_id:
                return feature
        raise KeyError(f"task {self.name} has no feature {feature_id}")

    def pairs(self) -> list[tuple[int, int]]:
        """Every unordered pair of feature ids, the smaller id first (it goes to the first seat)."""
        return list(itertools.combinations([f.id for f in self.features], 2))


def _read_patch(task_dir: pathlib.Path, relative: str) -> str:
    path = task_dir / relative
    if not path.is_file():
        raise TaskFormatError(f"CooperBench task {task_dir}: {relative} is missing")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskFormatError(f"CooperBench task {task_dir}: {relative} is not UTF-8 text") from None
    if not DIFF_HEADER.search(text) or "\n@@ " not in text:
        raise TaskFormatError(f"CooperBench task {task_dir}: {relative} is not a git diff (no 'diff --git' "
                              "header with hunks)")
    return text


def _read_feature(task_dir: pathlib.Path, folder: pathlib.Path) -> Feature:
    if not (folder / "feature.md").is_file():
        raise TaskFormatError(f"CooperBench task {task_dir}: {folder.name}/feature.md is missing")
    spec = (folder / "feature.md").read_text(encoding="utf-8", errors="replace")
    if not spec.strip():
        raise TaskFormatError(f"CooperBench task {task_dir}: {folder.name}/feature.md is empty")
    return Feature(int(FEATURE_DIR.fullmatch(folder.name).group(1)), spec,
                   _read_patch(task_dir, f"{folder.name}/feature.patch"),
                   _read_patch(task_dir, f"{folder.name}/tests.patch"))


def _check_repo_source(task_dir: pathlib.Path) -> None:
    bundle, checkout = task_dir / BUNDLE, task_dir / CHECKOUT
    if bundle.exists():
        with bundle.open("rb") as f:
            if not f.read(16).startswith(BUNDLE_SIGNATURES):
                raise TaskFormatError(f"CooperBench task {task_dir}: {BUNDLE} is not a git bundle")
    elif not checkout.is_dir():
        raise TaskFormatError(f"CooperBench task {task_dir}: the repository is missing ({BUNDLE} or "
                              f"{CHECKOUT}/)")
    elif not any(checkout.iterdir()):
        raise TaskFormatError(f"CooperBench task {task_dir}: {CHECKOUT}/ is empty")


def feature_dirs(task_dir: pathlib.Path) -> list[pathlib.Path]:
    found = [p for p in task_dir.iterdir() if p.is_dir() and FEATURE_DIR.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(FEATURE_DIR.fullmatch(p.name).group(1)))


def load_task(task_dir: str | pathlib.Path, name: str | None = None) -> Task:
    """The task in `task_dir`; TaskFormatError names the first missing or broken file."""
    task_dir = pathlib.Path(task_dir)
    if not task_dir.is_dir():
        raise TaskFormatError(f"CooperBench task {task_dir} is not a folder")
    folders = feature_dirs(task_dir)
    if len(folders) < 2:
        raise TaskFormatError(f"CooperBench task {task_dir}: needs at least two feature{{N}}/ folders, "
                              f"found {len(folders)}")
    features = tuple(_read_feature(task_dir, folder) for folder in folders)
    combined = _read_patch(task_dir, "combined.patch")
    if not (task_dir / "run_tests.sh").is_file():
        raise TaskFormatError(f"CooperBench task {task_dir}: run_tests.sh is missing")
    _check_repo_source(task_dir)
    return Task(name or task_dir.name, task_dir, features, combined)


def _task_dirs(folder: pathlib.Path) -> list[pathlib.Path]:
    if feature_dirs(folder):
        return [folder]
    return [task for sub in sorted(folder.iterdir()) if sub.is_dir() and not sub.name.startswith(".")
            for task in _task_dirs(sub)]


def load_tasks(root: str | pathlib.Path) -> list[Task]:
    """Every task under `root` (a folder holding feature{N}/ folders is a task; `root` may be one), sorted
    by name."""
    root = pathlib.Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"CooperBench tasks folder {root} is missing")
    task_dirs = _task_dirs(root)
    if not task_dirs:
        raise TaskFormatError(f"CooperBench tasks folder {root} holds no task (no feature{{N}}/ folders)")
    return [load_task(d, d.relative_to(root).as_posix() if d != root else root.name) for d in task_dirs]
