"""Scripted CooperBench agents (no model), and the host loop that plays them through the environment.

A speaker is a function of the episode that returns the text of its next turn, as a model would:
  gold   writes the gold content of every file its gold patch changes (write_file; in solo mode the
         task's combined.patch), tells the partner which files it changed (coop, with messaging), and
         finishes. Through the full evaluation it must score 1.
  empty  finishes at once. It must score 0.
`play` stands in for the dialogue rollout until that accepts scripted speakers: the opening, then one
turn at a time by `TurnResult.next_speaker` (alternation when None), then the rewards, through the
Environment methods only, so the engine's rollout can replace it without changing the environment.
"""

from __future__ import annotations

from typing import Callable, Mapping

from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message
from scope_jax.envs.cooperbench.environment import CooperBenchEnv, Pair
from scope_jax.envs.cooperbench.repo import post_images
from scope_jax.envs.cooperbench.tools import format_call

Speaker = Callable[[Episode], str]


def gold_plan(env: CooperBenchEnv, scenario: Pair, role: str) -> list[str]:
    """The gold agent's turns for `role` in `scenario`, in order."""
    features = env.seat_features(scenario, role)
    task = scenario.task
    patch = task.combined_patch if env.mode == "solo" else task.feature(features[0]).patch
    files = post_images(env.repos.base(task), patch)
    deleted = [path for path, content in files.items() if content is None]
    if deleted:
        raise ValueError(f"task {task.name}: the gold agent cannot delete files ({', '.join(deleted)})")
    turns = [format_call("write_file", path=path, content=content.decode())
             for path, content in files.items()]
    if "send_message" in env.tool_names:
        turns.append(format_call("send_message", text=f"I implemented feature {features[0]}; I changed "
                                 f"{', '.join(files)}."))
    return turns + [format_call("finish")]


def gold_speaker(env: CooperBenchEnv, role: str) -> Speaker:
    plans: dict[str, list[str]] = {}

    def speak(episode: Episode) -> str:
        key = str(episode.scenario)
        if key not in plans:
            plans[key] = gold_plan(env, episode.scenario, role)
        plan = plans[key]
        return plan[min(episode.turns(role), len(plan) - 1)]

    return speak


def empty_speaker(episode: Episode) -> str:
    return format_call("finish")


SPEAKERS = {"gold": gold_speaker, "empty": lambda env, role: empty_speaker}


def play(env, episode: Episode, speakers: Mapping[str, Speaker]) -> Episode:
    """Play `episode` to its end with one scripted speaker per role; fills in its rewards."""
    episode.messages.extend(env.opening(episode.scenario))
    role = env.first_speaker
    for _ in range(2 * env.max_turns):
        message = Message(role, speakers[role](episode))
        episode.messages.append(message)
        result = env.after_turn(episode, message)
        episode.messages.extend(result.messages)
        if result.done:
            episode.done, episode.end_reason = True, result.reason or "env"
            break
        role = result.next_speaker or (SIM if role == AGENT else AGENT)
    if not episode.done:
        episode.done, episode.end_reason = True, "turn_limit"
    episode.rewards = env.rewards(episode)
    return episode
