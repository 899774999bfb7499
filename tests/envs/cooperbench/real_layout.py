"""A task in the real CooperBench layout, built from scratch in a folder: a git repository made here and
bundled (repo.bundle), a run_tests.sh that starts with `git reset --hard` and `git clean -fd` as the
upstream scripts do, and two features whose gold patches conflict (both rewrite `greet`), so the union
merge keeps both definitions and the later one wins: coop gold fails one feature."""

import pathlib
import subprocess

BASE = {
    "pkg/__init__.py": "from pkg.core import greet\n",
    "pkg/core.py": 'def greet(name):\n    return "hello " + name\n',
    "tests/test_core.py":
        'from pkg.core import greet\n\n\ndef test_greet():\n    assert greet("ann") == "hello ann"\n',
}
SOURCES = {  # feature id -> pkg/core.py with the feature (0: both, the combined gold)
    1: 'def greet(name, shout=False):\n    text = "hello " + name\n'
       '    return text.upper() if shout else text\n',
    2: 'def greet(name, punct=""):\n    return "hello " + name + punct\n',
    0: 'def greet(name, shout=False, punct=""):\n    text = "hello " + name + punct\n'
       '    return text.upper() if shout else text\n',
}
TESTS = {
    1: '\n\ndef test_shout():\n    assert greet("ann", shout=True) == "HELLO ANN"\n'
       '    assert greet("bo") == "hello bo"\n',
    2: '\n\ndef test_punct():\n    assert greet("ann", punct="!") == "hello ann!"\n',
}
RUN_TESTS = """#!/bin/bash
set -e
REPO_PATH="$1"
TEST_PATCH="$2"
FEATURE_PATCH="${3:-}"
cd "$REPO_PATH"
git reset --hard HEAD
git clean -fd
if [[ -n "$FEATURE_PATCH" ]]; then
    git apply --ignore-whitespace "$FEATURE_PATCH" || git apply --3way "$FEATURE_PATCH"
fi
git apply --ignore-whitespace "$TEST_PATCH" || git apply --3way "$TEST_PATCH"
python -m pytest tests/test_core.py -v
"""
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _diff(repo: pathlib.Path, files: dict[str, str]) -> str:
    """`files` written over the base commit, as a git diff (the repository is left at the base)."""
    for path, text in files.items():
        (repo / path).write_text(text)
    patch = _git(repo, "diff", "HEAD")
    _git(repo, "checkout", "--", ".")
    return patch


def build(root: pathlib.Path) -> pathlib.Path:
    """The task folder root/demo_task/task1 (and its scratch repository root/src)."""
    repo, task = root / "src", root / "demo_task" / "task1"
    for path, text in BASE.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    task.mkdir(parents=True)
    _git(repo, "bundle", "create", str(task / "repo.bundle"), "HEAD")
    for feature in (1, 2):
        folder = task / f"feature{feature}"
        folder.mkdir()
        (folder / "feature.md").write_text(f"# Feature {feature}\n\nA keyword argument of greet.\n")
        (folder / "feature.patch").write_text(_diff(repo, {"pkg/core.py": SOURCES[feature]}))
        (folder / "tests.patch").write_text(
            _diff(repo, {"tests/test_core.py": BASE["tests/test_core.py"] + TESTS[feature]}))
    (task / "combined.patch").write_text(_diff(repo, {"pkg/core.py": SOURCES[0]}))
    (task / "run_tests.sh").write_text(RUN_TESTS)
    return task
