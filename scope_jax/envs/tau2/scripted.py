"""Scripted speakers for tau2 episodes, and a driver that plays them through an Environment.

A speaker is a function of the episode so far that returns its next message text. The oracle agent
replays a task's gold agent actions, one tool call per turn, then says every `communicate_info` string;
the null agent only talks; a scripted user says its lines in order and then `###STOP###`.

`play` drives one episode the way the engine's rollout drives model players (opening messages, the
environment's first speaker, `after_turn` after every message, its `next_speaker`, `max_turns` per
role, then `rewards`); all the episode logic is the environment's. It stands in until the rollout
accepts scripted speakers (issue 11), which can then replace it.
"""

from __future__ import annotations

from typing import Any, Callable

from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message
from scope_jax.envs.base import Environment
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


def play(env: Environment, scenario: Any, agent: Speaker, user: Speaker, group: int = 0) -> Episode:
    """One episode of `scenario` between scripted speakers, played to its end and rewarded."""
    episode = Episode(scenario, group=group)
    episode.messages.extend(env.opening(scenario))
    speaker = env.first_speaker
    spoken = {AGENT: 0, SIM: 0}
    while not episode.done:
        if spoken[speaker] >= env.max_turns:
            episode.done, episode.end_reason = True, "turn_limit"
            break
        message = Message(speaker, (agent if speaker == AGENT else user)(episode))
        spoken[speaker] += 1
        episode.messages.append(message)
        result = env.after_turn(episode, message)
        episode.messages.extend(result.messages)
        if result.done:
            episode.done, episode.end_reason = True, result.reason or "env"
        speaker = result.next_speaker or (SIM if speaker == AGENT else AGENT)
    episode.rewards = env.rewards(episode)
    return episode
