"""Toolkits: the tools one side (agent or user) may call on its database, and how a call becomes a result.

A toolkit class marks its tools with `@tool(KIND)` (READ, WRITE or GENERIC; only WRITE tools change
state) and the methods that only assertions and task initialisation may call with `@helper`. `call`
is what a model's tool call goes through, as in tau2-bench: the method is called with the arguments as
given (no schema validation, no type coercion), and any exception becomes an error result whose content
is `Error: ` + the exception's text. So an unknown tool gives `Error: Tool 'NAME' not found.`, and a
missing or extra argument gives Python's own message, which names the toolkit class and the method
(`Error: RetailTools.get_order_details() got an unexpected keyword argument 'foo'`). A call never raises.

Results are strings: a returned string as it is, anything else JSON-encoded with Python's defaults
(`json.dumps(..., default=str)`: separators ", " and ": ", keys in record order, ASCII escaped), a bare
number or bool as its quoted Python text.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Callable, ClassVar

from scope_jax.envs.tau2.db import Database

READ, WRITE, GENERIC = "read", "write", "generic"
ASSISTANT, USER = "assistant", "user"  # tau2-bench's names of the two sides (requestors)


def tool(kind: str) -> Callable[[Callable], Callable]:
    """Mark a toolkit method as a tool of `kind` (READ, WRITE or GENERIC)."""
    if kind not in (READ, WRITE, GENERIC):
        raise ValueError(f"tool kind {kind!r} is not one of {READ}, {WRITE}, {GENERIC}")

    def mark(method: Callable) -> Callable:
        method.tool_kind = kind
        return method

    return mark


def helper(method: Callable) -> Callable:
    """Mark a toolkit method that assertions and task initialisation may call, but models may not."""
    method.is_helper = True
    return method


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call of `name` with `arguments`, by `requestor` ("assistant" or "user"); `id` ties its result."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    requestor: str = ASSISTANT


@dataclasses.dataclass(frozen=True)
class ToolResult:
    content: str
    error: bool


def serialize(value: Any) -> str:
    """A tool's return value as the text of its result."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(str(value))
    return json.dumps(value, default=str)


class Toolkit:
    """The tools of one side over one database. Subclasses define tools with `@tool` and `@helper`.

    fix_quirks: behave as the domain's documented fixes say instead of reproducing tau2-bench's quirks
    (docs/tau2.md); a toolkit without quirks ignores it.
    """

    tools: ClassVar[dict[str, str]] = {}  # tool name -> kind, in name order
    helpers: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        members = {name: getattr(cls, name) for name in sorted(dir(cls)) if not name.startswith("_")}
        cls.tools = {name: m.tool_kind for name, m in members.items() if hasattr(m, "tool_kind")}
        cls.helpers = tuple(name for name, m in members.items() if getattr(m, "is_helper", False))

    def __init__(self, db: Database, fix_quirks: bool = False):
        self.db = db
        self.fix_quirks = fix_quirks

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Run a model's tool call; failures are error results, never exceptions."""
        if not isinstance(name, str) or name not in self.tools:
            return ToolResult(f"Error: Tool '{name}' not found.", True)
        if not isinstance(arguments, dict):
            return ToolResult(f"Error: the arguments of {name} must be a JSON object, got "
                              f"{type(arguments).__name__}", True)
        if self.fix_quirks:  # Q6 fixed: arguments must have their annotated types
            problem = argument_type_error(getattr(type(self), name), arguments)
            if problem:
                return ToolResult(f"Error: {problem}", True)
        try:
            value = getattr(self, name)(**arguments)
        except Exception as e:  # every failure of a tool is the model's to see (tau2-bench's contract)
            return ToolResult(f"Error: {e}", True)
        return ToolResult(serialize(value), False)

    def invoke(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool or helper for an assertion or a task's initialisation; exceptions propagate."""
        if name not in self.tools and name not in self.helpers:
            raise ValueError(f"{type(self).__name__} has no tool or helper {name!r}")
        return getattr(self, name)(**arguments)


def argument_type_error(method: Callable, arguments: dict[str, Any]) -> str | None:
    """What is wrong with the types of `arguments` for `method` (per its annotations), or None.
    Arguments the method does not take are left to the call (Python names them)."""
    hints = typing.get_type_hints(method)
    for name, value in arguments.items():
        if name in hints and not _has_type(value, hints[name]):
            hint = hints[name]
            expected = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            return f"Argument {name} must be of type {expected}, got {type(value).__name__}"
    return None


def _has_type(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_has_type(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if isinstance(value, bool) and hint is not bool:
        return False
    if hint is float:
        return isinstance(value, (int, float))
    return isinstance(value, hint)
