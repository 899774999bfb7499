"""Tool calls as text (tolerant parsing, counted failure kinds) and the file tools' guards."""

import os

import pytest

from scope_jax.envs.cooperbench.tools import ToolCall, ToolCallError, ToolError, Worktree, clip, parse_call

PARSED = [  # (turn text, the call it holds)
    ('{"tool": "read_file", "path": "a.py", "start": 1, "end": 9}',
     ToolCall("read_file", {"path": "a.py", "start": 1, "end": 9})),
    ('Let me look first.\n```json\n{"tool": "list_files"}\n```', ToolCall("list_files", {})),
    ('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py", "start": "3"}}\n</tool_call>',
     ToolCall("read_file", {"path": "a.py", "start": 3})),
    ('{"name": "replace", "arguments": "{\\"path\\": \\"a\\", \\"old\\": \\"x\\", \\"new\\": \\"y\\"}"}',
     ToolCall("replace", {"path": "a", "old": "x", "new": "y"})),
    ('{"tool": "send_message", "args": {"text": "I take {lines 1-5}",},}',
     ToolCall("send_message", {"text": "I take {lines 1-5}"})),
    ('I think {maybe} {"tool": "send_message", "text": "a 5\\" pipe }"} done',
     ToolCall("send_message", {"text": 'a 5" pipe }'})),
    ('```json\n{"tool": "write_file", "path": "p.py"}\n```\nThe file:\n```python\nprint("}")\n```',
     ToolCall("write_file", {"path": "p.py", "content": 'print("}")\n'})),
    ('{"tool": "replace", "path": "p.py"}\n```\nold line\n```\n```\nnew line\n```',
     ToolCall("replace", {"path": "p.py", "old": "old line\n", "new": "new line\n"})),
    ('{"tool": "finish"} and then {"tool": "run_tests"}', ToolCall("finish", {})),
    ('{"tool": "read_file", "path": "a.py", "start": "-2", "end": " 7 "}',
     ToolCall("read_file", {"path": "a.py", "start": -2, "end": 7})),
]


@pytest.mark.parametrize("text, call", PARSED)
def test_tolerant_parsing(text, call):
    assert parse_call(text) == call


FAILURES = [  # (turn text, failure kind)
    ("I will now edit the file.", "no_call"),
    ('{"path": "a.py"}', "no_call"),
    ('{"tool": "read_file", "path": "a.py"', "no_call"),
    ('{"tool": "read_file", path: "a.py"}', "bad_json"),
    ('{"name": "replace", "arguments": "{path: a}"}', "bad_json"),
    ('{"tool": "bash", "command": "rm -rf /"}', "unknown_tool"),
    ('{"tool": "read_file"}', "bad_arguments"),
    ('{"tool": "read_file", "path": "a.py", "line": 3}', "bad_arguments"),
    ('{"tool": "read_file", "path": 7}', "bad_arguments"),
    ('{"tool": "read_file", "path": "a.py", "start": true}', "bad_arguments"),
    ('{"tool": "read_file", "path": "a.py", "start": "three"}', "bad_arguments"),
    ('{"tool": "read_file", "args": ["a.py"]}', "bad_arguments"),
    # json.loads and int() raise ValueError or RecursionError on these, not JSONDecodeError
    pytest.param('{"tool": "read_file", "path": "a.py", "start": ' + "9" * 5000 + "}", "bad_json",
                 id="a 5000-digit integer"),
    pytest.param('{"tool": "read_file", "path": ' + "[" * 100_000 + "]" * 100_000 + "}", "bad_json",
                 id="deep nesting"),
    pytest.param('{"tool": "read_file", "arguments": "' + "[" * 100_000 + "]" * 100_000 + '"}', "bad_json",
                 id="deep nesting in the arguments string"),
    pytest.param('{"tool": "read_file", "path": "a.py", "start": "' + "9" * 5000 + '"}', "bad_arguments",
                 id="a 5000-digit string"),
    pytest.param('{"tool": "read_file", "path": "a.py", "start": "\\u00b2"}', "bad_arguments",
                 id="a superscript digit"),
    pytest.param('{"tool": "read_file", "path": "a.py", "start": "\\u0661\\u0662"}', "bad_arguments",
                 id="arabic-indic digits"),
    pytest.param('{"tool": "read_file", "path": "a.py", "start": "--3"}', "bad_arguments",
                 id="two minus signs"),
]


@pytest.mark.parametrize("text, kind", FAILURES)
def test_unreadable_calls_name_their_kind(text, kind):
    with pytest.raises(ToolCallError) as error:
        parse_call(text)
    assert error.value.kind == kind and "\n" not in str(error.value)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "core.py").write_text("".join(f"line {i}\n" for i in range(1, 8)))
    (root / "pkg" / "blob.bin").write_bytes(b"\x00\x01")
    (root / ".git").write_text("gitdir: elsewhere\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    os.symlink(tmp_path, root / "escape")
    return Worktree(root, max_file_bytes=64)


REFUSED = [  # (call on the tree, what the refusal says)
    (lambda t: t.read_file("/etc/passwd"), "leaves your checkout"),
    (lambda t: t.read_file("../secret.txt"), "leaves your checkout"),
    (lambda t: t.write_file("pkg/../../x.py", "x"), "leaves your checkout"),
    (lambda t: t.read_file("link.txt"), "symbolic link"),
    (lambda t: t.write_file("escape/planted.py", "x"), "symbolic link"),
    (lambda t: t.read_file(".git"), "inside .git"),
    (lambda t: t.write_file(".git/hooks/pre-commit", "x"), "inside .git"),
    (lambda t: t.write_file("sub/.git/HEAD", "ref: refs/heads/main\n"), "inside .git"),
    (lambda t: t.read_file("pkg/blob.bin"), "binary"),
    (lambda t: t.read_file("pkg/missing.py"), "no file"),
    (lambda t: t.read_file("pkg"), "it is a folder"),
    (lambda t: t.write_file("pkg/big.py", "x" * 65), "larger than 64 bytes"),
    (lambda t: t.read_file("pkg/core.py", 9, 10), "not a range"),
    (lambda t: t.replace("pkg/core.py", "line", "LINE"), "occurs 7 times"),
    (lambda t: t.replace("pkg/core.py", "absent", "x"), "occurs 0 times"),
    (lambda t: t.write_file("pkg/a\0b.py", "x"), "is not a file name"),
    (lambda t: t.write_file("pkg/\udcff.py", "x"), "is not a file name"),  # would be written as byte 0xff
    (lambda t: t.read_file("pkg/\ud800"), "is not a file name"),
    (lambda t: t.write_file("pkg/new.py", "\ud800"), "not UTF-8"),
    (lambda t: t.replace("pkg/core.py", "line 1\n", "\udcff"), "not UTF-8"),
]


@pytest.mark.parametrize("call, message", REFUSED, ids=[m for _, m in REFUSED])
def test_refused_calls(tree, call, message):
    with pytest.raises(ToolError, match=message):
        call(tree)
    assert not (tree.root.parent / "planted.py").exists() and not (tree.root.parent / "x.py").exists()


def test_oversized_file_is_refused_for_reading(tree):
    (tree.root / "pkg" / "large.py").write_text("x" * 65)
    with pytest.raises(ToolError, match="larger than 64 bytes"):
        tree.read_file("pkg/large.py")


def test_file_tools(tree):
    assert tree.read_file("pkg/core.py", 2, 3) == "pkg/core.py, lines 2-3 of 7:\n    2| line 2\n    3| line 3"
    assert tree.read_file("pkg/core.py", 7).endswith("    7| line 7")
    assert tree.replace("pkg/core.py", "line 4\n", "four\n") == "wrote pkg/core.py (7 lines)"
    assert "four" in (tree.root / "pkg" / "core.py").read_text()
    tree.write_file("pkg/sub/new.py", "a = 1\n")
    assert tree.list_files() == "pkg/blob.bin\npkg/core.py\npkg/sub/new.py"
    assert tree.list_files("pkg/sub") == "pkg/sub/new.py"


def test_clip_keeps_head_and_tail():
    text = "HEAD" + "x" * 1000 + "TAIL"
    clipped = clip(text, 100)
    assert clipped.startswith("HEAD") and clipped.endswith("TAIL") and "908 characters elided" in clipped
    assert clip("short", 100) == "short"
