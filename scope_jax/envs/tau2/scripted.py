"""Scripted speakers for tau2 episodes: replies as functions of the episode, for `ScriptedSpeaker`.

A speaker is a function of the episode so far that returns its next message text. The oracle agent
replays a task's gold agent actions, one tool call per turn, then says every `communicate_info` string;
the null agent only talks; a scripted user says its lines in order and then `###STOP###`.

They play through the engine's own rollout (`scope_jax.dialogue.rollout`), as models do.
"""

from __future__ import annotations

from typing import Callable

from scope_jax.dialogue.episode import Episode
from scope_jax.envs.tau2.tasks import Task
from scope_jax.envs.tau2.tool_calls import format_tool_call
from scope_jax.envs.tau2.toolkit import ASSISTANT

Speaker = Callable[[Episode], str]
USER_OPENING = "Hi, I need some help with my account."
USER_STOP_LINE = "Thank you, that is all. ###STOP###"
NULL_AGENT_LINE = "I am sorry, I cannot help with that."
ORACLE_CLOSING = "All done."


def oracle_agent(task: Task) -> Speaker:
    """The task's gold agent actions as tool calls, one per turn, then a closing message that contains
    every communicate_info string."""
    actions = task.criteria.actions if task.criteria is not None else None
    calls = iter([a.call for a in actions or () if a.call.requestor == ASSISTANT])
    info = task.criteria.communicate_info if task.criteria is not None else ()
    closing = " ".join([ORACLE_CLOSING, *info])

    def speak(episode: Episode) -> str:
        call = next(calls, None)
        return closing if call is None else format_tool_call(call)

    return speak


def null_agent(task: Task | None = None) -> Speaker:
    """An agent that never calls a tool."""
    return lambda episode: NULL_AGENT_LINE


def scripted_user(*lines: str) -> Speaker:
    """A user that says `lines` in order (USER_OPENING if none), then stops."""
    queue = iter(lines or (USER_OPENING,))
    return lambda episode: next(queue, USER_STOP_LINE)
