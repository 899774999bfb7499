"""Git plumbing: a task's base repository, one worktree per agent, and what an agent changed.

`Repos` keeps, under one scratch folder, a git repository per task checked out at the base commit (made
once from the task's repo.bundle or repo/), and the agents' worktrees of it (`git worktree add`, detached
at the base). The base checkout itself is never written after it is made, so it doubles as the base tree
that merges and test runs start from. Every git call here runs in the trusted process on data, never
on code an agent wrote; test runs go through the sandbox.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import Mapping

from scope_jax.envs.cooperbench.tasks import BUNDLE, Task

Changes = Mapping[str, "bytes | None"]  # path -> new content, None = deleted

# Fixed identity and dates: the base commit of a plain tree is the same on every machine.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "cooperbench",
           "GIT_AUTHOR_EMAIL": "cooperbench@localhost", "GIT_COMMITTER_NAME": "cooperbench",
           "GIT_COMMITTER_EMAIL": "cooperbench@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z", "GIT_TERMINAL_PROMPT": "0"}


class GitError(RuntimeError):
    """A git command failed; the message is the command and git's first line of complaint."""


def git(cwd: str | pathlib.Path, *args: str, input: bytes | None = None,
        env: Mapping[str, str] | None = None) -> bytes:
    done = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True,
                          env={**os.environ, **GIT_ENV, **(env or {})})
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"]
        raise GitError(f"git {' '.join(args[:2])} in {cwd}: {lines[0]}")
    return done.stdout


def _status_pairs(name_status: bytes) -> list[tuple[str, str]]:
    """(status letter, path) from `git diff --name-status -z --no-renames` output; GitError where a path is
    not UTF-8 (a file named past the tools)."""
    try:
        fields = name_status.decode().split("\0")[:-1]
    except UnicodeDecodeError as e:
        raise GitError(f"git diff --name-status: a path is not UTF-8 ({e})") from None
    return list(zip(fields[0::2], fields[1::2]))


def make_base(task: Task, dest: pathlib.Path) -> None:
    """A git checkout of the task's repository at its base commit, in `dest` (which must not exist)."""
    source = task.repo_source
    if source.name == BUNDLE or (source / ".git").exists():
        try:
            checkout(source, dest)
        except GitError as e:
            message = f"task {task.name}: cannot read the base commit from {source.name} ({e})"
            raise GitError(message) from None
    else:  # a plain tree: it is the base
        shutil.copytree(source, dest, symlinks=True)
        git(dest, "init", "-q")
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "--no-gpg-sign", "-m", "base")


def checkout(source: pathlib.Path, dest: pathlib.Path) -> None:
    """A new repository in `dest` (which must not exist) checked out, detached, at the HEAD of the
    repository or bundle `source`; its objects are copied, never shared with `source`."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q")
    git(dest, "fetch", "-q", "--no-tags", str(source.resolve()), "HEAD")
    git(dest, "checkout", "-q", "--detach", "FETCH_HEAD")


def as_patch(checkout_dir: pathlib.Path, files: Changes) -> bytes:
    """`files` written over the clean checkout `checkout_dir`, as a git diff against its HEAD (binary
    files included); the checkout is clean again afterwards."""
    write_files(checkout_dir, files)
    git(checkout_dir, "add", "-A")
    patch = git(checkout_dir, "diff", "--cached", "--binary", "--no-renames", "HEAD")
    git(checkout_dir, "reset", "-q", "--hard", "HEAD")
    git(checkout_dir, "clean", "-qfdx")
    return patch


def changes(worktree: pathlib.Path) -> dict[str, bytes | None]:
    """What differs in `worktree` from its base commit: path -> new content (None: deleted), sorted."""
    git(worktree, "add", "-A")
    listing = git(worktree, "diff", "--cached", "--name-status", "-z", "--no-renames", "HEAD")
    return {path: None if status == "D" else (worktree / path).read_bytes()
            for status, path in sorted(_status_pairs(listing), key=lambda pair: pair[1])}


def post_images(base: pathlib.Path, patch: str) -> dict[str, bytes | None]:
    """The files `patch` changes, as they read after applying it to the base (None: deleted); the base
    checkout is not touched (the patch goes into a scratch index)."""
    with tempfile.TemporaryDirectory(prefix="cooperbench-index-") as scratch:
        index = {"GIT_INDEX_FILE": str(pathlib.Path(scratch) / "index")}
        git(base, "read-tree", "HEAD", env=index)
        git(base, "apply", "--cached", "-", input=patch.encode(), env=index)
        listing = git(base, "diff", "--cached", "--name-status", "-z", "--no-renames", "HEAD", env=index)
        return {path: None if status == "D" else git(base, "show", f":{path}", env=index)
                for status, path in _status_pairs(listing)}


def write_files(dest: pathlib.Path, files: Changes) -> None:
    """Write `files` over the tree in `dest` (None: delete the file)."""
    for path, content in files.items():
        target = dest / path
        if content is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)


def diff_text(worktree: pathlib.Path, paths: list[str]) -> str:
    """The unified diff of `paths` in `worktree` against its base (after `changes` staged them)."""
    if not paths:
        return ""
    return git(worktree, "diff", "--cached", "--no-renames", "HEAD", "--", *paths).decode(errors="replace")


def _safe_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


class Repos:
    """Task base repositories and agent worktrees under one scratch folder (removed by `close`)."""

    def __init__(self, root: str | pathlib.Path | None = None):
        self._scratch = None if root else tempfile.TemporaryDirectory(prefix="cooperbench-")
        self.root = pathlib.Path(root or self._scratch.name)
        self._bases: dict[str, pathlib.Path] = {}
        self._count = 0

    def base(self, task: Task) -> pathlib.Path:
        """The task's base checkout, made on first use."""
        if task.name not in self._bases:
            dest = self.root / "tasks" / _safe_name(task.name)
            make_base(task, dest)
            self._bases[task.name] = dest
        return self._bases[task.name]

    def add_worktree(self, task: Task, label: str) -> pathlib.Path:
        """A new worktree of the task's base commit; `label` names it (e.g. the seat)."""
        self._count += 1
        path = self.root / "worktrees" / f"{self._count:06d}-{_safe_name(label)}"
        git(self.base(task), "worktree", "add", "-q", "--detach", str(path), "HEAD")
        return path

    def fork_worktree(self, task: Task, path: pathlib.Path) -> pathlib.Path:
        """A new worktree of the task's base with the files of the worktree `path` as they are now."""
        fork = self.add_worktree(task, path.name.split("-", 1)[-1] + "-fork")
        write_files(fork, changes(path))
        return fork

    def remove_worktree(self, task: Task, path: pathlib.Path) -> None:
        git(self.base(task), "worktree", "remove", "--force", str(path))

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
