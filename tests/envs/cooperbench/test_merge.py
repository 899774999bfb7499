"""Stripping and merging, checked against the released evaluator's own procedure as the reference: real
branches merged with `git merge` (seat 2's branch checked out, seat 1's merged in), and for the union
step the same merge with `* merge=union` in .gitattributes."""

import subprocess

import pytest

from scope_jax.envs.cooperbench.merge import is_protected, merge, source_changes

BASE = {"pkg/a.py": b"".join(b"line %d\n" % i for i in range(1, 11)), "pkg/b.py": b"x = 1\n"}


def _edit(lines: dict[int, bytes | None], insert: dict[int, bytes] | None = None) -> bytes:
    """pkg/a.py with line n replaced (None: deleted) and text inserted after line n (0: at the top)."""
    out = [insert[0]] if insert and 0 in insert else []
    for n, line in enumerate(BASE["pkg/a.py"].splitlines(keepends=True), 1):
        replaced = lines.get(n, line)
        out += [replaced] if replaced is not None else []
        out += [insert[n]] if insert and n in insert else []
    return b"".join(out)


CASES = {  # name: (seat 1's changes, seat 2's changes)
    "one side only": ({"pkg/a.py": _edit({2: b"ONE\n"})}, {}),
    "identical edits": ({"pkg/a.py": _edit({2: b"SAME\n"})}, {"pkg/a.py": _edit({2: b"SAME\n"})}),
    "separated by one line": ({"pkg/a.py": _edit({2: b"ONE\n"})}, {"pkg/a.py": _edit({4: b"TWO\n"})}),
    "adjacent lines": ({"pkg/a.py": _edit({2: b"ONE\n"})}, {"pkg/a.py": _edit({3: b"TWO\n"})}),
    "edit and insert after it": ({"pkg/a.py": _edit({5: b"ONE\n"})}, {"pkg/a.py": _edit({}, {5: b"NEW\n"})}),
    "both append": ({"pkg/a.py": _edit({}, {10: b"ONE\n"})}, {"pkg/a.py": _edit({}, {10: b"TWO\n"})}),
    "two conflicts far apart": ({"pkg/a.py": _edit({1: b"A1\n", 9: b"A9\n"})},
                                {"pkg/a.py": _edit({1: b"B1\n", 9: b"B9\n"})}),
    "different files": ({"pkg/a.py": _edit({1: b"ONE\n"})}, {"pkg/b.py": b"x = 2\n"}),
    "both add a file": ({"pkg/new.py": b"def f():\n    return 1\n"},
                        {"pkg/new.py": b"def g():\n    return 2\n"}),
    "delete and modify": ({"pkg/b.py": None}, {"pkg/b.py": b"x = 3\n"}),
}


def _git(cwd, *args, check=True):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, check=check)


def _reference(tmp_path, seat1, seat2, union):
    """(merged tree or None on conflict) by real branches and `git merge`."""
    repo = tmp_path / "reference"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "base")
    for path, content in BASE.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(content)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    for branch, changes in (("seat1", seat1), ("seat2", seat2)):
        _git(repo, "checkout", "-q", "-b", branch, "base")
        for path, content in changes.items():
            if content is None:
                (repo / path).unlink()
            else:
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_bytes(content)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", branch, "--allow-empty")
    if union:
        (repo / ".git" / "info" / "attributes").write_text("* merge=union\n")
    if _git(repo, "merge", "-q", "--no-edit", "seat1", check=False).returncode != 0:
        return None
    paths = sorted({*BASE, *seat1, *seat2})
    return {path: (repo / path).read_bytes() for path in paths if (repo / path).exists()}


def _ours(files, seat1, seat2):
    tree = dict(BASE)
    for path, content in files.items():
        if content is None:
            tree.pop(path, None)
        else:
            tree[path] = content
    return {path: tree[path] for path in sorted({*BASE, *seat1, *seat2}) if path in tree}


@pytest.mark.parametrize("name", CASES)
def test_merge_matches_git_merge_of_branches(tmp_path, name):
    seat1, seat2 = CASES[name]
    plain = merge(BASE.get, seat2, seat1, union=False)
    union = merge(BASE.get, seat2, seat1, union=True)
    reference_plain = _reference(tmp_path / "plain", seat1, seat2, union=False)
    reference_union = _reference(tmp_path / "union", seat1, seat2, union=True)
    assert (plain.status == "conflict") == (reference_plain is None)
    assert (union.status == "conflict") == (reference_union is None)
    if reference_plain is not None:
        assert plain.status == "clean" and _ours(plain.files, seat1, seat2) == reference_plain
    if reference_union is not None:
        assert _ours(union.files, seat1, seat2) == reference_union
        assert union.status == ("clean" if reference_plain is not None else "union")


def test_conflicts_are_counted_per_hunk():
    seat1, seat2 = CASES["two conflicts far apart"]
    result = merge(BASE.get, seat2, seat1)
    assert (result.status, result.conflicts, result.conflicted) == ("union", 2, ("pkg/a.py",))
    assert merge(BASE.get, {}, {}).status == "empty"
    deleted = merge(BASE.get, *reversed(CASES["delete and modify"]))
    assert (deleted.status, deleted.conflicts, deleted.unresolved) == ("conflict", 1, ("pkg/b.py",))


def test_union_puts_seat_two_first():
    seat1, seat2 = CASES["both append"]
    merged = merge(BASE.get, seat2, seat1).files["pkg/a.py"]
    assert merged.endswith(b"line 10\nTWO\nONE\n")


PROTECTED = ["tests/test_core.py", "test_top.py", "pkg/tests/helpers.py", "pkg/core_test.py", "test/data.txt",
             "pkg/tests.py", "conftest.py", "pkg/conftest.py", "pytest.ini", "setup.cfg", "pyproject.toml",
             "tox.ini", "evil.pth", "sitecustomize.py", "pkg/usercustomize.py"]
SOURCE = ["pkg/core.py", "pkg/testing_tools.py", "README.md", "pkg/contest.py", "docs/tests.md"]


def test_test_and_harness_files_are_stripped():
    assert all(is_protected(p) for p in PROTECTED)
    assert not any(is_protected(p) for p in SOURCE)
    kept, dropped = source_changes({p: b"x" for p in PROTECTED + SOURCE} | {"tests/test_old.py": None})
    assert sorted(kept) == sorted(SOURCE) and sorted(dropped) == sorted(PROTECTED + ["tests/test_old.py"])
