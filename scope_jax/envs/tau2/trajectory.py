"""An episode as tau2-bench's evaluator sees it: assistant, user and tool turns with their tool calls.

The environment records one `Turn` per message (the greeting, a resumed history, each parsed agent and
user message, each tool result); the evaluator reads only these, never the raw model text.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scope_jax.envs.tau2.tasks import Tau2DataError
from scope_jax.envs.tau2.toolkit import ASSISTANT, USER, ToolCall

TOOL = "tool"


@dataclasses.dataclass(frozen=True)
class Turn:
    """role: "assistant", "user" or "tool". content: the text (None when there is none: a pure tool-call
    message). A tool turn answers the call `tool_call_id` of `requestor`; `error` marks a failed call."""

    role: str
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    requestor: str = ASSISTANT
    error: bool = False


def history_turns(history: tuple[dict[str, Any], ...], task_id: str) -> list[Turn]:
    """A task's `initial_state.message_history` (tau2-bench message records) as turns."""
    turns, requestors = [], {}
    for i, record in enumerate(history):
        role = record.get("role")
        if role in (ASSISTANT, USER):
            calls = tuple(ToolCall(c["name"], dict(c.get("arguments") or {}), id=str(c.get("id", "")),
                                   requestor=role) for c in record.get("tool_calls") or ())
            requestors.update({c.id: role for c in calls})
            turns.append(Turn(role, record.get("content"), calls))
        elif role == TOOL:
            call_id = str(record.get("id", ""))
            turns.append(Turn(TOOL, record.get("content"), tool_call_id=call_id,
                              requestor=requestors.get(call_id, ASSISTANT), error=bool(record.get("error"))))
        else:
            raise Tau2DataError(f"task {task_id}: message {i} of the history has role {role!r}")
    return turns
