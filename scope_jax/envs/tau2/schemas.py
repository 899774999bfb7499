"""OpenAI function schemas of a toolkit's tools, from each method's signature and docstring.

The form of tau2-bench's schemas: `{"type": "function", "function": {"name", "description",
"parameters"}}`, where the description is the docstring's first paragraph (as one line), followed by a
blank line and the rest of the text before `Args:` if there is any, and the parameters are a JSON-schema
object (`title: "parameters"`) with each argument's type, a title made from its name ("Order Id") and
the description its `Args:` entry gives; arguments without a default are required. Ready for a chat
template's `tools=` argument.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable

from scope_jax.envs.tau2.toolkit import Toolkit

_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def _paragraphs(lines: list[str]) -> list[str]:
    text = "\n".join(lines).strip()
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in lines:
        match = _SECTION.match(line)
        if match:
            current = match.group(1)
            sections[current] = []
        else:
            sections[current].append(line)
    paragraphs = _paragraphs(sections[""])
    description = "\n\n".join(paragraphs[:1] + ([" ".join(paragraphs[1:])] if paragraphs[1:] else []))
    arguments: dict[str, str] = {}
    name = None
    for line in sections.get("Args", sections.get("Arguments", [])):
        match = re.match(r"^    (\w+)(?: \([^)]*\))?:\s*(.*)$", line)
        if match:
            name = match.group(1)
            arguments[name] = match.group(2).strip()
        elif name is not None and line.strip():
            arguments[name] = f"{arguments[name]} {line.strip()}"
    return description, arguments


def json_type(hint: Any) -> dict[str, Any]:
    """The JSON schema of a Python type annotation (str, int, float, bool, list[...], X | None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [json_type(a) for a in args]}
    if origin is list:
        return {"type": "array", "items": json_type(args[0])}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
    if hint not in simple:
        raise TypeError(f"no JSON schema for the annotation {hint!r}")
    return {"type": simple[hint]}


def tool_schema(method: Callable) -> dict[str, Any]:
    """The OpenAI function schema of one tool method."""
    if not method.__doc__:
        raise ValueError(f"tool {method.__name__} has no docstring (its description for the model)")
    description, documented = parse_docstring(method.__doc__)
    hints = typing.get_type_hints(method)
    properties, required = {}, []
    for name, parameter in inspect.signature(method).parameters.items():
        if name == "self":
            continue
        if name not in documented:
            raise ValueError(f"tool {method.__name__}: argument {name} is not described under Args")
        properties[name] = {**json_type(hints[name]), "title": name.replace("_", " ").title(),
                            "description": documented[name]}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        else:
            properties[name]["default"] = parameter.default
    return {"type": "function", "function": {
        "name": method.__name__, "description": description,
        "parameters": {"type": "object", "title": "parameters", "properties": properties,
                       "required": required}}}


def toolkit_schemas(toolkit: type[Toolkit]) -> list[dict[str, Any]]:
    """The schemas of all tools of a toolkit class, in name order."""
    return [tool_schema(getattr(toolkit, name)) for name in toolkit.tools]
