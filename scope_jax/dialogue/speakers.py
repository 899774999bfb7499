"""Who speaks a role's turn: a speaker is called with the episodes whose turn it is and returns the
role's next message in each of them.

    ModelSpeaker       one model: one batched generate call over all the episodes (rows spread over the
                       player's mesh, if it has one)
    PopulationSpeaker  P members of one architecture with stacked params [P, ...]: one generate call
                       vmapped over P, episode e voiced by member e.sim_index
    MembersSpeaker     a list of speakers, episode e voiced by speakers[e.sim_index] (rotation, mixture)
    ScriptedSpeaker    a Python function of the episode that returns the reply text (an oracle agent, a
                       scripted user), in place of a model on either side

Model speakers grow each episode's `RoleView` of their role (`episode.views[role]`): before generating,
by the new tokens that make it the prompt (`model_prompts`), and after, by the sampled reply. A prompt
that no longer fits the player's context (prompt + max_new_tokens > max_context) is not generated from;
the speaker returns None for that episode, and the turn loop ends it ("context_limit").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from transformers import PreTrainedTokenizerBase

from scope_jax.dialogue.episode import Episode, Message
from scope_jax.dialogue.views import RoleView
from scope_jax.envs.base import Environment
from scope_jax.sampling import SamplingConfig, generate, generate_population


class Speaker(Protocol):
    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        """`role`'s next message in each of `episodes` (None: its prompt no longer fits the context)."""


@dataclasses.dataclass(frozen=True)
class Player:
    """A model that plays a role: its architecture, parameters, tokenizer and sampling settings.

    max_context: longest prompt plus reply (tokens) it may be given. For a population, params carry a
    leading member axis. mesh: when set, each generate call spreads its rows over the mesh's (data,
    fsdp) axes (see `scope_jax.sampling`).
    """

    graphdef: nnx.GraphDef
    params: Any
    tokenizer: PreTrainedTokenizerBase
    sampling: SamplingConfig
    max_context: int = 2048
    mesh: Mesh | None = None

    def fits(self, prompt_length: int, max_new_tokens: int | None = None) -> bool:
        """Whether a prompt of `prompt_length` tokens and its reply fit the context."""
        budget = self.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
        return prompt_length + budget <= self.max_context


@dataclasses.dataclass(frozen=True)
class Sample:
    """One generated reply: its ids (stop token included), their log-probs, and whether it stopped."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    stopped: bool


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


def model_prompts(player: Player, env: Environment, role: str,
                  episodes: Sequence[Episode]) -> list[RoleView | None]:
    """Grow each episode's view of `role` into the prompt of its next turn; None (view left as it was)
    where that prompt and a reply would not fit the player's context."""
    views = []
    for episode in episodes:
        view = episode.views.setdefault(role, RoleView())
        segment = view.next_prompt(player.tokenizer, env.system_prompt(episode.scenario, role),
                                   episode.messages, role)
        if player.fits(len(view) + len(segment.ids)):
            view.add_prompt(segment)
            views.append(view)
        else:
            views.append(None)
    return views


def _replies(player: Player, role: str, views: list[RoleView | None],
             samples: Sequence[Sample]) -> list[Message | None]:
    """Messages of the sampled replies (in the order of the live views), each appended to its view."""
    replies, samples = [], iter(samples)
    for view in views:
        if view is None:
            replies.append(None)
            continue
        sample = next(samples)
        message = Message(role, reply_text(player.tokenizer, sample), sampled_ids=sample.ids,
                          logprobs=sample.logprobs, stopped=sample.stopped)
        view.add_reply(message)
        replies.append(message)
    return replies


@dataclasses.dataclass(frozen=True)
class ModelSpeaker:
    """One model voices the role in every episode: one batched generate call per turn."""

    player: Player

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        views = model_prompts(self.player, env, role, episodes)
        live = [view.ids for view in views if view is not None]
        samples = sample_replies(self.player, live, key) if live else []
        return _replies(self.player, role, views, samples)


@dataclasses.dataclass(frozen=True)
class PopulationSpeaker:
    """P members of one architecture, stacked params [P, ...]: one vmapped generate call per turn, the
    episode e voiced by member e.sim_index (each member's rows padded to the largest member's)."""

    player: Player
    population: int

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        views = model_prompts(self.player, env, role, episodes)
        live = [(e, v) for e, v in zip(episodes, views) if v is not None]
        if not live:
            return [None] * len(episodes)
        by_member = [[v.ids for e, v in live if e.sim_index == m] for m in range(self.population)]
        rows = max(len(prompts) for prompts in by_member)
        width = max(len(v.ids) for _, v in live)
        padded = [_padded(prompts, self.player.sampling.pad_token_id, rows, width) for prompts in by_member]
        tokens, lengths = map(np.stack, zip(*padded))
        out = jax.device_get(generate_population(self.player.graphdef, self.player.params, tokens, lengths,
                                                 key, self.player.sampling, self.player.mesh))
        member_samples = [iter(_samples(jax.tree.map(lambda x: x[m], out), len(prompts)))
                          for m, prompts in enumerate(by_member)]
        samples = [next(member_samples[e.sim_index]) for e, _ in live]
        return _replies(self.player, role, views, samples)


@dataclasses.dataclass(frozen=True)
class MembersSpeaker:
    """Episode e is voiced by speakers[e.sim_index] (each called once per turn on its own episodes)."""

    speakers: tuple[Speaker, ...]

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        replies: dict[int, Message | None] = {}
        for index, speaker in enumerate(self.speakers):
            mine = [i for i, e in enumerate(episodes) if e.sim_index == index]
            if mine:
                said = speaker(env, role, [episodes[i] for i in mine], jax.random.fold_in(key, index))
                replies.update(zip(mine, said))
        return [replies[i] for i in range(len(episodes))]


@dataclasses.dataclass(frozen=True)
class ScriptedSpeaker:
    """The reply is `reply(episode)`: plain text, no sampled tokens (nothing of it is trained)."""

    reply: Callable[[Episode], str]

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        return [Message(role, self.reply(episode)) for episode in episodes]
