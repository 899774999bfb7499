"""The batched turn loop: agent and simulators take turns over a whole batch of episodes.

Each turn, every unfinished episode's speaker gets its prompt (its token view with a generation prompt)
and one jitted `generate` call per model samples all of their replies at once (rows spread over the
player's mesh, if it has one); finished episodes are simply not in the call. The environment then sees
each reply (tool calls, end signals). Text handling runs on the host between turns; everything a model
computes runs on the device.

How the simulator side speaks is a `SimTurn`, chosen by the simulator mode:
  members_turn      each simulator voices its own episodes (one simulator, rotation over models)
  population_turn   P simulators of one architecture, stacked params, one vmapped call over P
  verbalized_turn   the simulator states k candidate replies with probabilities; one is sampled
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from transformers import PreTrainedTokenizerBase

from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message
from scope_jax.dialogue.views import role_view
from scope_jax.envs.base import Environment
from scope_jax.sampling import SamplingConfig, generate, generate_population
from scope_jax.simulators.verbalized import VerbalizedSampler

log = logging.getLogger(__name__)

SimTurn = Callable[[Environment, list[Episode], jax.Array], None]


@dataclasses.dataclass(frozen=True)
class Player:
    """A model that plays a role: its architecture, parameters, tokenizer and sampling settings.

    max_context: longest prompt (tokens) it may be given; an episode whose next prompt is longer ends
    with reason "context_limit". For a population, params carry a leading member axis. mesh: when set,
    each generate call spreads its rows over the mesh's (data, fsdp) axes (see `scope_jax.sampling`).
    """

    graphdef: nnx.GraphDef
    params: Any
    tokenizer: PreTrainedTokenizerBase
    sampling: SamplingConfig
    max_context: int = 2048
    mesh: Mesh | None = None


@dataclasses.dataclass(frozen=True)
class Sample:
    """One generated reply: its ids (stop token included), their log-probs, and whether it stopped."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    stopped: bool


def _prompts(player: Player, role: str, env: Environment,
             episodes: Sequence[Episode]) -> list[tuple[Episode, tuple[int, ...]]]:
    """(episode, prompt ids) of the episodes that still fit the context; the others end here."""
    live = []
    for episode in episodes:
        system = env.system_prompt(episode.scenario, role)
        prompt = role_view(player.tokenizer, system, episode.messages, role, add_generation_prompt=True).ids
        if len(prompt) + player.sampling.max_new_tokens > player.max_context:
            episode.done, episode.end_reason = True, "context_limit"
            log.warning("episode ended at the context limit (%d prompt tokens)", len(prompt))
        else:
            live.append((episode, prompt))
    return live


def _padded(prompts: Sequence[Sequence[int]], pad_id: int, rows: int = 0,
            width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded [rows, width] tokens and [rows] lengths (extra rows have length 0: inactive)."""
    rows = rows or len(prompts)
    width = width or max((len(p) for p in prompts), default=1)
    tokens = np.full((rows, width), pad_id, np.int32)
    lengths = np.zeros((rows,), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, :len(prompt)], lengths[row] = prompt, len(prompt)
    return tokens, lengths


def _samples(out, rows: int) -> list[Sample]:
    out = jax.device_get(out)
    samples = []
    for row in range(rows):
        n = int(out.lengths[row])
        samples.append(Sample(tuple(int(t) for t in out.tokens[row, :n]),
                              tuple(float(x) for x in out.logprobs[row, :n]), bool(out.done[row])))
    return samples


def sample_replies(player: Player, prompts: Sequence[Sequence[int]], key: jax.Array,
                   sampling: SamplingConfig | None = None) -> list[Sample]:
    """One batched generate call for `prompts` (token id lists)."""
    sampling = sampling or player.sampling
    tokens, lengths = _padded(prompts, sampling.pad_token_id)
    return _samples(generate(player.graphdef, player.params, tokens, lengths, key, sampling, player.mesh),
                    len(prompts))


def reply_text(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> str:
    return tokenizer.decode(sample.ids[:-1] if sample.stopped else sample.ids, skip_special_tokens=True)


def _record(role: str, env: Environment, episode: Episode, message: Message) -> None:
    """Append `message` and let the environment react to it."""
    episode.messages.append(message)
    result = env.after_turn(episode, message)
    episode.messages.extend(result.messages)
    if result.done:
        episode.done, episode.end_reason = True, result.reason or "env"


def _sampled_message(player: Player, role: str, prompt: tuple[int, ...], sample: Sample) -> Message:
    return Message(role, reply_text(player.tokenizer, sample), sampled_ids=sample.ids,
                   logprobs=sample.logprobs, stopped=sample.stopped, prompt_ids=prompt)


def speak(player: Player, role: str, env: Environment, episodes: Sequence[Episode], key: jax.Array) -> None:
    """One turn of `role` in each of `episodes`, generated by `player` in a single batched call."""
    live = _prompts(player, role, env, episodes)
    if live:
        samples = sample_replies(player, [p for _, p in live], key)
        for (episode, prompt), sample in zip(live, samples):
            _record(role, env, episode, _sampled_message(player, role, prompt, sample))


def members_turn(players: Sequence[Player]) -> SimTurn:
    """Simulator turns where episode e is voiced by players[e.sim_index] (one call per member)."""

    def turn(env: Environment, episodes: list[Episode], key: jax.Array) -> None:
        for index, player in enumerate(players):
            members = [e for e in episodes if e.sim_index == index]
            if members:
                speak(player, SIM, env, members, jax.random.fold_in(key, index))

    return turn


def population_turn(player: Player, population: int) -> SimTurn:
    """Simulator turns of P members with stacked params [P, ...]: one vmapped generate call."""

    def turn(env: Environment, episodes: list[Episode], key: jax.Array) -> None:
        live = _prompts(player, SIM, env, episodes)
        if not live:
            return
        by_member = [[(e, p) for e, p in live if e.sim_index == m] for m in range(population)]
        rows = max(len(members) for members in by_member)
        width = max(len(p) for _, p in live)
        padded = [_padded([p for _, p in members], player.sampling.pad_token_id, rows, width)
                  for members in by_member]
        tokens, lengths = map(np.stack, zip(*padded))
        out = jax.device_get(generate_population(player.graphdef, player.params, tokens, lengths, key,
                                                 player.sampling, player.mesh))
        for member, members in enumerate(by_member):
            samples = _samples(jax.tree.map(lambda x: x[member], out), len(members))
            for (episode, prompt), sample in zip(members, samples):
                _record(SIM, env, episode, _sampled_message(player, SIM, prompt, sample))

    return turn


def verbalized_turn(player: Player, sampler: VerbalizedSampler, max_new_tokens: int) -> SimTurn:
    """Simulator turns by Verbalized Sampling: the simulator's system prompt asks for k candidate replies
    with probabilities (up to `max_new_tokens` tokens), one is drawn, and only that reply enters the
    dialogue. Unparsable answers are retried and then replaced by direct sampling (counted by `sampler`).
    Each turn's record (p_max, entropy, candidates kept, parse failures) goes to episode.info["verbalized"].
    """
    verbalize = dataclasses.replace(player.sampling, max_new_tokens=max_new_tokens)

    def turn(env: Environment, episodes: list[Episode], key: jax.Array) -> None:
        def replies(system_prompts: list[str], rows: list[int], sampling: SamplingConfig,
                    subkey: jax.Array) -> list[str]:
            views = [role_view(player.tokenizer, system, episodes[r].messages, SIM,
                               add_generation_prompt=True).ids for system, r in zip(system_prompts, rows)]
            return [reply_text(player.tokenizer, s) for s in sample_replies(player, views, subkey, sampling)]

        attempt_key, direct_key, choice_key = jax.random.split(key, 3)
        instructions = [env.system_prompt(e.scenario, SIM) for e in episodes]
        choices = sampler.choose_batch(
            instructions, jax.random.split(choice_key, len(episodes)),
            generate=lambda prompts, attempt, rows: replies(prompts, rows, verbalize,
                                                            jax.random.fold_in(attempt_key, attempt)),
            direct=lambda plain, rows: replies(plain, rows, player.sampling, direct_key))
        for episode, (text, record) in zip(episodes, choices):
            episode.info.setdefault("verbalized", []).append(record.metrics())
            _record(SIM, env, episode, Message(SIM, text))

    return turn


def rollout(env: Environment, episodes: list[Episode], agent: Player, sim_turn: SimTurn | None,
            key: jax.Array, last_turn: int | None = None) -> list[Episode]:
    """Play new `episodes`: the environment's opening messages, then `play` from turn 0 (to the end, or
    up to `last_turn`)."""
    for episode in episodes:
        episode.messages.extend(env.opening(episode.scenario))
    return play(env, episodes, agent, sim_turn, key, last_turn=last_turn)


def play(env: Environment, episodes: list[Episode], agent: Player, sim_turn: SimTurn | None, key: jax.Array,
         first_turn: int = 0, last_turn: int | None = None) -> list[Episode]:
    """Continue `episodes` from turn `first_turn`: turns alternate from env.first_speaker, each role speaks
    at most env.max_turns times, the simulator side through `sim_turn`. Played to the end (an environment
    with a `closing` question gets the simulator's answer in one extra turn; rewards filled in), or only up
    to turn `last_turn` (exclusive; nothing is finalised): a fork point. Forked copies of an episode
    continue from there with `first_turn=last_turn`."""
    order = [env.first_speaker, SIM if env.first_speaker == AGENT else AGENT]
    end = 2 * env.max_turns if last_turn is None else last_turn
    for turn in range(first_turn, end):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        turn_key = jax.random.fold_in(key, turn)
        if order[turn % 2] == AGENT:
            speak(agent, AGENT, env, active, turn_key)
        else:
            sim_turn(env, active, turn_key)
    if last_turn is not None:
        return episodes
    closing = getattr(env, "closing", lambda episode: [])
    asked = []
    for episode in episodes:
        question = [] if episode.done else closing(episode)
        if question:
            episode.messages.extend(question)
            asked.append(episode)
    if asked:
        sim_turn(env, asked, jax.random.fold_in(key, end))
    for episode in episodes:
        if not episode.done:
            episode.done, episode.end_reason = True, "turn_limit"
        episode.rewards = env.rewards(episode)
    return episodes
