"""The batched turn loop: the episodes of a batch take their turns together, one call per speaker.

Every episode has a next speaker. It starts as the environment's `first_speaker`; after each turn the
environment may name the next one (`TurnResult.next_speaker`, e.g. the agent again after a tool result),
and otherwise the other role speaks. A role speaks at most its turn cap (`turn_cap`); an episode whose
next speaker has used up its turns ends ("turn_limit"). Each round, every unfinished episode takes one
turn: the episodes are grouped by who speaks, and each role's speaker (`scope_jax.dialogue.speakers`)
is called once with its group. Text handling runs on the host between turns; everything a model
computes runs on the device.

At the end, an environment with a `closing` question gets the simulator's answer in one extra turn, and
every episode gets its rewards.

`play` hands each speaker the episodes it plays (`speakers.for_rollout`): model speakers keep per-row
KV caches over them, which end when `play` returns.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

import jax

from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import AGENT, ROLES, SIM, Episode, Message
from scope_jax.dialogue.speakers import ScriptedSpeaker, Speaker, for_rollout

log = logging.getLogger(__name__)

Speakers = Mapping[str, Speaker]  # role -> who speaks it


def turn_cap(env: Environment, role: str) -> int:
    """Turns `role` may take: env.max_turns, an int for both roles or a {role: int} mapping."""
    cap = env.max_turns
    return cap[role] if isinstance(cap, Mapping) else cap


def rollout(env: Environment, episodes: list[Episode], speakers: Speakers, key: jax.Array,
            pause_before: str | None = None) -> list[Episode]:
    """Play new `episodes`: the environment's opening messages, then `play`."""
    for episode in episodes:
        episode.messages.extend(env.opening(episode.scenario))
        _schedule(env, episode, env.first_speaker)
    return play(env, episodes, speakers, key, pause_before=pause_before)


def rollout_scripted(env: Environment, episodes: list[Episode],
                     replies: Mapping[str, Callable[[Episode], str]]) -> list[Episode]:
    """`rollout` with a scripted reply function per role (an oracle agent, a scripted user): no model."""
    speakers = {role: ScriptedSpeaker(reply) for role, reply in replies.items()}
    return rollout(env, episodes, speakers, jax.random.key(0))


def play(env: Environment, episodes: list[Episode], speakers: Speakers, key: jax.Array,
         pause_before: str | None = None) -> list[Episode]:
    """Continue `episodes` until every one has ended, then close them (`finish`). With `pause_before` a
    role, an episode whose next speaker is that role waits instead, and nothing is finalised: a fork
    point (copies of the episodes continue with another `play`)."""
    speakers = {role: for_rollout(speaker, episodes) for role, speaker in speakers.items()}
    turns_key, closing_key = jax.random.split(key)
    for round_index in range(sum(turn_cap(env, role) for role in ROLES)):
        waiting = [e for e in episodes if not e.done and e.next_speaker != pause_before]
        if not waiting:
            break
        round_key = jax.random.fold_in(turns_key, round_index)
        turns = {role: [e for e in waiting if e.next_speaker == role] for role in ROLES}
        for index, (role, turn) in enumerate(turns.items()):
            if turn:
                take_turn(env, role, speakers[role], turn, jax.random.fold_in(round_key, index))
    if pause_before is None:
        finish(env, episodes, speakers.get(SIM), closing_key)
    return episodes


def take_turn(env: Environment, role: str, speaker: Speaker, episodes: list[Episode],
              key: jax.Array) -> None:
    """One turn of `role` in each of `episodes`, by one call of `speaker`."""
    for episode, message in zip(episodes, speaker(env, role, episodes, key), strict=True):
        if message is None:
            _end(episode, "context_limit")
            log.warning("episode ended at the context limit of the %s", role)
        else:
            record(env, episode, message)


def record(env: Environment, episode: Episode, message: Message) -> None:
    """Append `message`, let the environment react to it, and schedule the next speaker."""
    episode.messages.append(message)
    episode.turns_taken[message.role] = episode.turns_taken.get(message.role, 0) + 1
    result = env.after_turn(episode, message)
    episode.messages.extend(result.messages)
    if result.done:
        _end(episode, result.reason or "env")
    elif not episode.done:
        _schedule(env, episode, result.next_speaker or (SIM if message.role == AGENT else AGENT))


def finish(env: Environment, episodes: list[Episode], sim: Speaker | None, key: jax.Array) -> None:
    """The closing question (if the environment has one) to the episodes that reached the turn limit,
    answered by the simulator in one extra turn; then every episode's rewards."""
    closing = getattr(env, "closing", None)
    asked = []
    for episode in episodes:
        question = closing(episode) if closing is not None and episode.end_reason == "turn_limit" else []
        if question:
            episode.messages.extend(question)
            asked.append(episode)
    if asked:
        take_turn(env, SIM, sim, asked, key)
    for episode in episodes:
        episode.rewards = env.rewards(episode)


def _schedule(env: Environment, episode: Episode, role: str) -> None:
    if episode.turns_taken.get(role, 0) >= turn_cap(env, role):
        _end(episode, "turn_limit")
    else:
        episode.next_speaker = role


def _end(episode: Episode, reason: str) -> None:
    episode.done, episode.end_reason = True, reason
