"""Scripted CooperBench agents (no model): replies as functions of the episode, for `ScriptedSpeaker`.

A speaker is a function of the episode that returns the text of its next turn, as a model would:
  gold   writes the gold content of every file its gold patch changes (write_file; in solo mode the
         task's combined.patch), tells the partner which files it changed (coop, with messaging), and
         finishes. Through the full evaluation it must score 1.
  empty  finishes at once. It must score 0.
They play through the engine's own rollout (`scope_jax.dialogue.rollout`), as models do.
"""

from __future__ import annotations

from typing import Callable

from scope_jax.dialogue.episode import Episode
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
        return plan[min(episode.turns_taken.get(role, 0), len(plan) - 1)]

    return speak


def empty_speaker(episode: Episode) -> str:
    return format_call("finish")


SPEAKERS = {"gold": gold_speaker, "empty": lambda env, role: empty_speaker}
