"""Merging the two agents' changes: test and harness files stripped, then a plain merge, then a union merge.

Agents may not change tests: `source_changes` drops every file CooperBench's evaluator filters (a path
containing /test_, /tests/, _test.py, /test/ or tests.py) and the files that steer pytest or Python
itself: every file name pytest reads options from (pytest.ini, .pytest.ini, pyproject.toml, tox.ini,
setup.cfg), conftest.py, sitecustomize.py, usercustomize.py, *.pth, and anything under a *.dist-info or
*.egg-info folder (package metadata, whose entry points load pytest plugins).

`merge` works file by file on contents, as `git merge-file` does in the paper's pipeline: a file changed
by one side is taken from it, identical changes are taken once, and a file both sides changed is merged
three-way (seat 2's version as "ours", the base, seat 1's as "theirs", the released evaluator's order: in a
union the second seat's lines come first). Files both sides added are merged against an empty base. The
plain merge's conflict hunks are counted; with `union` each conflicted file is merged again keeping both
sides' lines. A file deleted by one side and changed by the other cannot be merged either way.
Status: "empty" (no changes), "clean", "union" (conflicts, all resolved by union) or "conflict" (left
unresolved: both features fail).
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import tempfile
from typing import Callable

from scope_jax.envs.cooperbench.repo import Changes

TEST_MARKERS = ("/test_", "/tests/", "_test.py", "/test/", "tests.py")
HARNESS_FILES = ("conftest.py", "pytest.ini", ".pytest.ini", "setup.cfg", "pyproject.toml", "tox.ini",
                 "sitecustomize.py", "usercustomize.py")
METADATA_FOLDERS = (".dist-info", ".egg-info")
LABELS = ("seat2", "base", "seat1")


def is_protected(path: str) -> bool:
    """A test or harness file, which agents' changes may not touch."""
    *folders, name = path.split("/")
    return (any(marker in "/" + path for marker in TEST_MARKERS) or name in HARNESS_FILES
            or name.endswith(".pth") or any(folder.endswith(METADATA_FOLDERS) for folder in folders))


def source_changes(changes: Changes) -> tuple[dict[str, bytes | None], tuple[str, ...]]:
    """(the changes to non-protected files, the protected paths dropped)."""
    kept = {path: content for path, content in changes.items() if not is_protected(path)}
    return kept, tuple(path for path in changes if path not in kept)


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """files: the merged changes (path -> content, None = deleted); conflicts: the plain merge's conflict
    hunks (a delete/modify clash counts one); conflicted: the files with any; unresolved: those left after
    the union step (all of them without it)."""

    status: str
    files: dict[str, bytes | None]
    conflicts: int = 0
    conflicted: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()

    def record(self) -> dict:
        """Plain data for logs and summaries (file contents left out)."""
        return {"status": self.status, "conflicts": self.conflicts, "conflicted": list(self.conflicted),
                "unresolved": list(self.unresolved), "files": sorted(self.files)}


def merge_file(ours: bytes, base: bytes, theirs: bytes, union: bool = False) -> tuple[bytes, int | None]:
    """`git merge-file -p` of three versions: (merged text, conflict hunks); None hunks when git refuses
    the merge (binary content)."""
    with tempfile.TemporaryDirectory(prefix="cooperbench-merge-") as scratch:
        paths = []
        for label, content in zip(LABELS, (ours, base, theirs)):
            path = pathlib.Path(scratch) / label
            path.write_bytes(content)
            paths.append(str(path))
        labels = [arg for label in LABELS for arg in ("-L", label)]
        done = subprocess.run(["git", "merge-file", "-p", *(["--union"] if union else []), *labels, *paths],
                              capture_output=True)
    if done.returncode > 127:  # git reports errors as a negative status
        return b"", None
    return done.stdout, done.returncode


def merge(base: Callable[[str], bytes | None], ours: Changes, theirs: Changes,
          union: bool = True) -> MergeResult:
    """Merge seat 2's changes (`ours`) with seat 1's (`theirs`); `base(path)` reads the base version."""
    files: dict[str, bytes | None] = {}
    conflicts, conflicted, unresolved = 0, [], []
    for path in sorted(set(ours) | set(theirs)):
        if path not in ours or path not in theirs or ours[path] == theirs[path]:
            files[path] = ours[path] if path in ours else theirs[path]
            continue
        mine, other = ours[path], theirs[path]
        if mine is None or other is None:  # deleted on one side, changed on the other
            conflicts += 1
            conflicted.append(path)
            unresolved.append(path)
            continue
        original = base(path) or b""
        merged, hunks = merge_file(mine, original, other)
        if hunks == 0:
            files[path] = merged
            continue
        conflicts += hunks or 1
        conflicted.append(path)
        if union and hunks is not None:
            files[path], _ = merge_file(mine, original, other, union=True)
        else:
            unresolved.append(path)
    if not ours and not theirs:
        status = "empty"
    else:
        status = "conflict" if unresolved else "union" if conflicted else "clean"
    return MergeResult(status, files, conflicts, tuple(conflicted), tuple(unresolved))
