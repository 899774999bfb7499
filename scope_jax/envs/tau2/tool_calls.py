"""Tool calls in generated text: a tolerant parser, the canonical text form, and JSON objects in model text.

One text convention serves every chat template: a call is a JSON object
`{"name": TOOL, "arguments": {...}}` between `<tool_call>` and `</tool_call>`. That is what Qwen3
generates from its template's own tool support, and what the environment's "text" tool format teaches
models whose template has none (SmolLM2's; see `prompts.tools_text`). The parser accepts, besides:
  - a missing `</tool_call>` at the end of the text (generation stopped inside the call),
  - the object inside a ```json fence, trailing text after it, `parameters` for `arguments`, the
    arguments as a JSON-encoded string (OpenAI's wire form), Python-literal syntax (single quotes),
  - a message that is nothing but such an object (optionally fenced), without the tags.
A `<tool_call>` block that still cannot be read is a parse failure: counted, with its reason, and
left out of the calls. So is a call whose name or arguments hold a string that is not UTF-8 text (a
JSON escape such as `\\ud800` decodes to a lone surrogate, which tokenizers reject), an untagged
object with a "name" key that is no call, and an untagged message that is one unreadable object with a
"name" key (the text of both stays the content). The message's `content` is its
text outside all tool-call blocks.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, Callable

from scope_jax.envs.tau2.toolkit import ASSISTANT, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.S)
_FENCE = re.compile(r"^\s*```(?:json|python)?\s*(.*?)\s*```\s*$", re.S)
_NAMES_A_TOOL = re.compile(r"""\{.*["']name["']\s*:.*\}$""", re.S)


@dataclasses.dataclass(frozen=True)
class ParsedMessage:
    """content: the text outside tool-call blocks, stripped (None if blank); calls: the readable calls,
    in order, with fresh ids; failures: why each unreadable block failed."""

    content: str | None
    calls: tuple[ToolCall, ...]
    failures: tuple[str, ...]


def loads_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (fences and surrounding prose allowed; Python-literal syntax as a
    fallback), or None."""
    fenced = _FENCE.match(text)
    text = (fenced.group(1) if fenced else text).strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):  # besides bad JSON: an integer over 4300 digits, deep nesting
        value = _python_literal(text[start:text.rfind("}") + 1])
    return value if isinstance(value, dict) else None


def _python_literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _call(obj: dict[str, Any] | None, requestor: str, call_id: str) -> tuple[ToolCall | None, str]:
    """The call an object describes, or (None, why not)."""
    if obj is None:
        return None, "no JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "no tool name"
    if not _all_utf8(name):
        return None, "the tool name is not UTF-8 text"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None, f"the arguments of {name} are a string that is not JSON"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"the arguments of {name} are not an object"
    if not _all_utf8(arguments):
        return None, f"the arguments of {name} hold a string that is not UTF-8 text"
    return ToolCall(name, arguments, id=call_id, requestor=requestor), ""


def _all_utf8(value: Any) -> bool:
    """Whether every string in `value` (nested keys and items included) encodes as UTF-8."""
    pending = [value]  # a loop, not recursion: parsed values may nest about as deep as the stack allows
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            pending.extend(item.items())
        elif isinstance(item, (list, tuple, set, frozenset)):
            pending.extend(item)
    return True


def parse_tool_calls(text: str, next_id: Callable[[], str], requestor: str = ASSISTANT) -> ParsedMessage:
    """The tool calls of a generated message; `next_id()` gives each readable call its id."""
    calls, failures = [], []
    blocks = list(_BLOCK.finditer(text))
    if blocks:
        for block in blocks:
            call, why = _call(loads_object(block.group(1)), requestor, "")
            if call is None:
                failures.append(why)
            else:
                calls.append(dataclasses.replace(call, id=next_id()))
        content = _BLOCK.sub("", text).strip()
    else:
        whole = _FENCE.match(text)
        body = (whole.group(1) if whole else text).strip()
        obj = loads_object(body) if body.startswith("{") and body.endswith("}") else None
        if obj is not None:
            call, why = _call(obj, requestor, "") if "name" in obj else (None, "")
        else:  # a whole object that names a tool but does not parse is a failed call
            call, why = None, "no JSON object" if _NAMES_A_TOOL.match(body) else ""
        if call is not None:
            calls.append(dataclasses.replace(call, id=next_id()))
        elif why:
            failures.append(why)
        content = "" if call is not None else text.strip()
    return ParsedMessage(content or None, tuple(calls), tuple(failures))


def format_tool_call(call: ToolCall) -> str:
    """The text form of a call (what a model is taught to write, and how scripted speakers write)."""
    return f"{OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n{CLOSE}"
