"""The agents' tools: calls written as text, and the file tools confined to one worktree.

A turn holds one tool call, a JSON object naming the tool and its arguments:
    {"tool": "read_file", "path": "pkg/core.py", "start": 1, "end": 40}
The parser is tolerant of the forms models produce: prose or a ```json fence around the object, a
<tool_call>...</tool_call> wrapper, the function-call shape {"name": ..., "arguments": {...}} (arguments
also as a JSON string), arguments nested under "args", trailing commas. Long text may follow the object
in fenced code blocks instead of JSON strings: write_file takes its `content` from the first block, replace
takes `old` and `new` from the first two. A whole number may also be given as a string of at most 18
ASCII digits, with an optional minus sign. A turn it cannot read raises ToolCallError with a `kind`
("no_call", "bad_json", "unknown_tool", "bad_arguments") for the caller to count; JSON that Python's
decoder refuses for size (an integer of thousands of digits, thousands of nested brackets) is "bad_json".

`Worktree` runs the file tools; a path that is absolute, climbs out with "..", passes through a symlink,
or passes through a .git folder (at any depth) is refused, as is one with a NUL or a character that is not
UTF-8 text (a lone surrogate: it would name a file git cannot report), and so are binary files, contents
that are not UTF-8 text and files or contents above `max_file_bytes`. A refused call raises ToolError,
whose message becomes the call's error result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any

FENCED_BLOCK = re.compile(r"```[\w+-]*[^\S\n]*\n(.*?)```", re.DOTALL)
TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
TRAILING_COMMA = re.compile(r",\s*([}\]])")
INTEGER = re.compile(r"-?[0-9]{1,18}")  # what a whole number given as a string may be (after strip)


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool: its name, required and optional arguments (those in `integers` are whole numbers), and
    the one-line description agents are shown."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    description: str
    integers: tuple[str, ...] = ()

    def signature(self) -> str:
        args = [*self.required, *(f"{a}?" for a in self.optional)]
        return f"{self.name}({', '.join(args)})"


TOOLS = (
    ToolSpec("list_files", (), ("path",), "list the files under a folder of your checkout (default: all)"),
    ToolSpec("read_file", ("path",), ("start", "end"),
             "show lines start..end of a file (1-based, inclusive; default: the whole file)",
             ("start", "end")),
    ToolSpec("replace", ("path", "old", "new"), (),
             "replace the one occurrence of the text `old` in a file by `new` (old must occur exactly once)"),
    ToolSpec("write_file", ("path", "content"), (), "create a file, or overwrite it, with `content`"),
    ToolSpec("run_tests", (), (), "run the repository's visible tests on your checkout"),
    ToolSpec("send_message", ("text",), (), "send a message to your partner"),
    ToolSpec("finish", (), (), "stop working; your checkout is taken as it is now"),
)
SPECS = {spec.name: spec for spec in TOOLS}


class ToolCallError(ValueError):
    """A turn without a usable tool call; `kind`: "no_call", "bad_json", "unknown_tool" or "bad_arguments"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class ToolError(ValueError):
    """A well-formed call that is refused (a path outside the worktree, a file too large, ...)."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]


def format_call(name: str, **args: Any) -> str:
    """The canonical text of a call (what the prompts show and scripted agents write)."""
    return json.dumps({"tool": name, **args})


def _objects(text: str):
    """(start, end, text) of each balanced {...} span, outermost, in order; strings are respected."""
    depth, start, in_string, escaped = 0, 0, False, False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"' and depth:
            in_string = True
        elif char == "{":
            start = i if depth == 0 else start
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                yield start, i + 1, text[start:i + 1]


def _decode(span: str) -> Any:
    try:
        return json.loads(span)
    except json.JSONDecodeError:
        return json.loads(TRAILING_COMMA.sub(r"\1", span))


def _call_object(text: str) -> tuple[dict, int]:
    """The first JSON object in `text` that names a tool, and where it ends."""
    undecodable = False
    for _, end, span in _objects(text):
        try:
            obj = _decode(span)
        except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long to read
            undecodable = True
            continue
        if isinstance(obj, dict) and isinstance(obj.get("tool", obj.get("name")), str):
            return obj, end
    if undecodable:
        raise ToolCallError("bad_json", "the tool call is not valid JSON")
    raise ToolCallError("no_call", "no tool call found: reply with one JSON object such as "
                        + format_call("list_files"))


def _arguments(obj: dict) -> dict:
    for key in ("arguments", "args", "parameters"):
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    raise ToolCallError("bad_json", f"the tool call's {key} are not valid JSON") from None
            if not isinstance(args, dict):
                raise ToolCallError("bad_arguments", f"the tool call's {key} must be an object")
            return dict(args)
    return {k: v for k, v in obj.items() if k not in ("tool", "name")}


def parse_call(text: str) -> ToolCall:
    """The tool call in one turn's text (see the module docstring); raises ToolCallError."""
    tagged = TOOL_CALL_TAG.search(text)
    body = tagged.group(1) if tagged else text
    obj, end = _call_object(body)
    name = obj.get("tool", obj.get("name"))
    if name not in SPECS:
        raise ToolCallError("unknown_tool", f"unknown tool {name!r}; the tools are {', '.join(SPECS)}")
    spec, args = SPECS[name], _arguments(obj)
    blocks = [m.group(1) for m in FENCED_BLOCK.finditer(body) if m.start() >= end]
    for key, block in zip({"write_file": ("content",), "replace": ("old", "new")}.get(name, ()), blocks):
        args.setdefault(key, block)
    missing = [a for a in spec.required if a not in args]
    unknown = [a for a in args if a not in spec.required + spec.optional]
    if missing or unknown:
        problem = f"missing {', '.join(missing)}" if missing else f"unknown argument(s) {', '.join(unknown)}"
        raise ToolCallError("bad_arguments", f"{spec.signature()}: {problem}")
    for key, value in args.items():
        wanted = int if key in spec.integers else str
        if wanted is int and isinstance(value, str) and INTEGER.fullmatch(value.strip()):
            args[key] = value = int(value)
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise ToolCallError("bad_arguments", f"{spec.signature()}: {key} must be a "
                                f"{'whole number' if wanted is int else 'string'}")
    return ToolCall(name, args)


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


@dataclasses.dataclass(frozen=True)
class Worktree:
    """The file tools on one agent's checkout."""

    root: pathlib.Path
    max_file_bytes: int = 64 << 10
    max_listing: int = 200

    def resolve(self, path: str) -> pathlib.Path:
        """The file `path` names, if it stays inside the worktree (see the module docstring)."""
        try:  # strictly: a lone surrogate (JSON's "\\udcff") would name a file git reports as bytes not UTF-8
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(f"path {path!r} is not a file name: it holds a lone surrogate") from None
        if "\0" in path:
            raise ToolError(f"path {path!r} is not a file name: it holds a NUL")
        parts = pathlib.PurePosixPath(path.strip()).parts
        if not parts or path.strip() in (".", "./"):
            return self.root
        if os.path.isabs(path) or ".." in parts:
            raise ToolError(f"path {path!r} leaves your checkout: use a path relative to its root")
        if ".git" in parts:
            raise ToolError(f"path {path!r} is inside .git, which the tools do not touch")
        current = self.root
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise ToolError(f"path {path!r} passes through a symbolic link")
        return current

    def _file(self, path: str) -> pathlib.Path:
        file = self.resolve(path)
        if not file.is_file():
            raise ToolError(f"no file {path!r}" + (" (it is a folder)" if file.is_dir() else ""))
        if file.stat().st_size > self.max_file_bytes:
            raise ToolError(f"file {path!r} is larger than {self.max_file_bytes} bytes")
        return file

    def _text(self, path: str) -> str:
        data = self._file(path).read_bytes()
        if b"\0" in data:
            raise ToolError(f"file {path!r} is binary")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"file {path!r} is not UTF-8 text") from None

    def list_files(self, path: str = ".") -> str:
        folder = self.resolve(path)
        if not folder.is_dir():
            raise ToolError(f"no folder {path!r}")
        files = sorted(p.relative_to(self.root).as_posix() for p in folder.rglob("*")
                       if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(self.root).parts)
        shown = files[:self.max_listing]
        more = f"\n[... and {len(files) - len(shown)} more]" if len(files) > len(shown) else ""
        return "\n".join(shown) + more if files else f"(no files under {path!r})"

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        lines = self._text(path).splitlines()
        if not lines:
            return f"{path} is empty"
        if start < 1 or start > len(lines) or end is not None and end < start:
            raise ToolError(f"lines {start}..{end} are not a range of {path!r} ({len(lines)} lines)")
        end = len(lines) if end is None else min(end, len(lines))
        numbered = "\n".join(f"{n:5d}| {line}" for n, line in enumerate(lines[start - 1:end], start))
        return f"{path}, lines {start}-{end} of {len(lines)}:\n{numbered}"

    def replace(self, path: str, old: str, new: str) -> str:
        text = self._text(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"the text to replace occurs {count} times in {path!r}; it must occur exactly "
                            "once")
        return self.write_file(path, text.replace(old, new))

    def write_file(self, path: str, content: str) -> str:
        file = self.resolve(path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError("the content is not UTF-8 text: it holds a lone surrogate") from None
        if len(data) > self.max_file_bytes:
            raise ToolError(f"content of {len(data)} bytes is larger than {self.max_file_bytes} bytes")
        if file == self.root or file.is_dir():
            raise ToolError(f"{path!r} is a folder")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
        return f"wrote {path} ({len(content.splitlines())} lines)"
