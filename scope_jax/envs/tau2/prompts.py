"""System prompts of the two roles, and the tool list for chat templates without tool support.

Agent: `<instructions>` (ours: serve the user within the policy; per turn a message or a tool call,
never both) and `<policy>` (the domain's policy.md, verbatim). User simulator: tau2-bench's guideline
file from the data folder (the tools variant when the user has tools), a blank line, then the task's
scenario between `<scenario>` lines. With the "text" tool format (templates without tool support), the
role's tools and the `<tool_call>` convention are appended to its prompt (`tools_text`).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from scope_jax.envs.tau2.tool_calls import CLOSE, OPEN

AGENT_INSTRUCTIONS = (
    "You are a customer service agent. Help the user with their request while following the policy "
    "below at all times.\n"
    "In each turn, either send a message to the user or make a tool call, never both in the same turn.\n"
    "Give only information that comes from the user or from tool results. Tool call arguments must be "
    "valid JSON.")
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def agent_prompt(policy: str, tools: str = "") -> str:
    prompt = f"<instructions>\n{AGENT_INSTRUCTIONS}\n</instructions>\n<policy>\n{policy}\n</policy>"
    return f"{prompt}\n\n{tools}" if tools else prompt


def user_prompt(guidelines: str, scenario: str, tools: str = "") -> str:
    prompt = f"{guidelines}\n\n<scenario>\n{scenario}\n</scenario>"
    return f"{prompt}\n\n{tools}" if tools else prompt


def tools_text(schemas: Sequence[dict[str, Any]]) -> str:
    """The tools and how to call them, for a prompt (the "text" tool format)."""
    listing = "\n".join(json.dumps(schema) for schema in schemas)
    example = json.dumps({"name": "TOOL_NAME", "arguments": {"ARGUMENT": "VALUE"}})
    return ("# Tools\n\nYou can call these tools, described as JSON schemas:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            f"To call a tool, answer with only the call, as a JSON object between {OPEN} and {CLOSE}:\n"
            f"{OPEN}\n{example}\n{CLOSE}\n"
            f"The result comes back in the next message, between {RESPONSE_OPEN} and {RESPONSE_CLOSE}.")


def tool_response_text(content: str) -> str:
    """A tool result as the "text" tool format shows it."""
    return f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"


def template_renders_tools(tokenizer, schemas: Sequence[dict[str, Any]]) -> bool:
    """Whether `tokenizer`'s chat template shows tools passed as `tools=` (Qwen3's does, SmolLM2's
    ignores them: use the "text" tool format there)."""
    chat = [{"role": "system", "content": "system"}, {"role": "user", "content": "user"}]
    plain = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return plain != tokenizer.apply_chat_template(chat, tools=list(schemas), tokenize=False,
                                                  add_generation_prompt=True)
