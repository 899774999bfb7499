"""The task loader: our suite and the real layout, malformed folders refused in one line, repo sources."""

import pathlib
import shutil
import subprocess

import pytest

from scope_jax.envs.cooperbench.merge import is_protected
from scope_jax.envs.cooperbench.repo import Repos, changes, post_images
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import TaskFormatError, load_task, load_tasks

REAL_DATA = pathlib.Path(__file__).resolve().parents[3] / "../shared/data/cooperbench"


def test_suite_loads(tmp_path):
    tasks = load_tasks(SUITE_DIR)
    assert len(tasks) >= 8
    repos = Repos(tmp_path)
    for task in tasks:
        assert [f.id for f in task.features] == [1, 2] and task.pairs() == [(1, 2)]
        touched = []
        for feature in task.features:
            assert "**Files Modified**" in feature.spec
            touched.append(set(post_images(repos.base(task), feature.patch)))
            assert touched[-1] and not any(is_protected(path) for path in touched[-1])
            assert all(is_protected(path) for path in post_images(repos.base(task), feature.tests_patch))
        assert touched[0] & touched[1], f"{task.name}: the two features must touch a common file"


def _remove(path: pathlib.Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


BREAKAGES = [  # (what to do to the task folder, the file the error must name)
    (lambda t: _remove(t / "feature1" / "feature.patch"), "feature1/feature.patch is missing"),
    (lambda t: _remove(t / "feature2" / "tests.patch"), "feature2/tests.patch is missing"),
    (lambda t: _remove(t / "feature1" / "feature.md"), "feature1/feature.md is missing"),
    (lambda t: (t / "feature1" / "feature.md").write_text("  \n"), "feature1/feature.md is empty"),
    (lambda t: (t / "feature2" / "feature.patch").write_text("add the feature\n"),
     "feature2/feature.patch is not a git diff"),
    (lambda t: (t / "feature1" / "tests.patch").write_bytes(b"\xff\xfe"),
     "feature1/tests.patch is not UTF-8"),
    (lambda t: _remove(t / "combined.patch"), "combined.patch is missing"),
    (lambda t: _remove(t / "run_tests.sh"), "run_tests.sh is missing"),
    (lambda t: _remove(t / "repo"), "the repository is missing (repo.bundle or repo/)"),
    (lambda t: (t / "repo.bundle").write_text("not a bundle"), "repo.bundle is not a git bundle"),
    (lambda t: _remove(t / "feature2"), "needs at least two feature{N}/ folders, found 1"),
]


@pytest.mark.parametrize("breakage, message", BREAKAGES, ids=[m for _, m in BREAKAGES])
def test_malformed_task_is_refused_in_one_line(task_copy, breakage, message):
    breakage(task_copy)
    with pytest.raises(TaskFormatError) as error:
        load_tasks(task_copy.parent)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_real_task_without_patches_is_refused():
    task_dir = REAL_DATA / "samuelcolvin_dirty_equals_task" / "task43"
    if not task_dir.is_dir():
        pytest.skip(f"the real CooperBench task is absent ({task_dir})")
    assert (task_dir / "feature1" / "feature.md").read_text().startswith("**Title**")
    with pytest.raises(TaskFormatError, match="feature1/feature.patch is missing"):
        load_tasks(REAL_DATA)


def test_task_names_are_paths_under_the_root(tmp_path, task_copy):
    nested = tmp_path / "tasks" / "owner_repo_task" / "task7"
    shutil.copytree(task_copy, nested)
    assert [t.name for t in load_tasks(tmp_path / "tasks")] == ["commands", "owner_repo_task/task7"]
    assert load_tasks(nested)[0].name == "task7"


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _as_checkout(task_dir: pathlib.Path) -> None:
    """Turn repo/ into a git checkout at its base, with a later commit that must not be used."""
    repo = task_dir / "repo"
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True).stdout.strip()
    (repo / "LATER.txt").write_text("after the base\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "later")
    _git(repo, "checkout", "-q", "--detach", base)


@pytest.mark.parametrize("form", ["plain tree", "checkout", "bundle"])
def test_repository_forms_give_the_same_base(task_copy, tmp_path, form):
    expected = sorted(p.relative_to(task_copy / "repo").as_posix()
                      for p in (task_copy / "repo").rglob("*") if p.is_file())
    if form != "plain tree":
        _as_checkout(task_copy)
    if form == "bundle":
        _git(task_copy / "repo", "bundle", "create", "-q", str(task_copy / "repo.bundle"), "HEAD", "--all")
        shutil.rmtree(task_copy / "repo")
    task = load_task(task_copy)
    repos = Repos(tmp_path / "scratch")
    base = repos.base(task)
    found = sorted(p.relative_to(base).as_posix() for p in base.rglob("*")
                   if p.is_file() and ".git" not in p.relative_to(base).parts)
    assert found == expected
    worktree = repos.add_worktree(task, "seat1")
    assert changes(worktree) == {}
    (worktree / "linetools" / "commands.py").write_text("changed\n")
    (worktree / "new.py").write_text("x = 1\n")
    (worktree / "linetools" / "__init__.py").unlink()
    assert changes(worktree) == {"linetools/__init__.py": None, "linetools/commands.py": b"changed\n",
                                 "new.py": b"x = 1\n"}
    repos.remove_worktree(task, worktree)
    assert not worktree.exists()
