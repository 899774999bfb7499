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

KV caches. The turn loop hands every speaker the episodes of a rollout at its start (`for_rollout`). A
model speaker whose player has `kv_cache` on then keeps a `RolloutCache` for that rollout: one row of
`scope_jax.kv_cache` per episode (per member of a population), the rows of a GRPO group consecutive so
that their common prompt prefix (system prompt, persona card, tool policy) is computed once. Each call
passes the episodes' grown views, so only what is new since the role's last call is prefilled; episodes
that sit a call out keep their rows. The cache ends with the rollout (it belongs to one set of
parameters). Its counts add up in the speaker's `CacheLog` (`cache_stats`); a view that did not extend
its row's cache is re-prefilled, counted and logged. With `kv_cache` off, or outside a rollout, every
call re-prefills the whole prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from scope_jax import kv_cache
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import Episode, Message
from scope_jax.dialogue.views import RoleView, template_tools
from scope_jax.kv_cache import CacheStats
from scope_jax.sampling import SampleOutput, SamplingConfig, generate, generate_population

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class Speaker(Protocol):
    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        """`role`'s next message in each of `episodes` (None: its prompt no longer fits the context)."""


@dataclasses.dataclass(frozen=True)
class Player:
    """A model that plays a role: its architecture, parameters, tokenizer and sampling settings.

    max_context: longest prompt plus reply (tokens) it may be given. For a population, params carry a
    leading member axis. mesh: when set, each generate call spreads its rows over the mesh's (data,
    fsdp) axes (see `scope_jax.sampling`). kv_cache: in a rollout, keep per-row KV caches across its
    turns (see the module docstring); off: re-prefill every prompt.
    """

    graphdef: nnx.GraphDef
    params: Any
    tokenizer: PreTrainedTokenizerBase
    sampling: SamplingConfig
    max_context: int = 2048
    mesh: Mesh | None = None
    kv_cache: bool = True

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


def _samples(out: SampleOutput, rows: Sequence[int | tuple[int, int]]) -> list[Sample]:
    """The samples of `rows` (indices into out's leading axes: a row, or (member, row)) of a generate
    call's output."""
    out = jax.device_get(out)
    samples = []
    for row in rows:
        n = int(out.lengths[row])
        samples.append(Sample(tuple(int(t) for t in out.tokens[row][:n]),
                              tuple(float(x) for x in out.logprobs[row][:n]), bool(out.done[row])))
    return samples


def sample_replies(player: Player, prompts: Sequence[Sequence[int]], key: jax.Array,
                   sampling: SamplingConfig | None = None) -> list[Sample]:
    """One batched generate call for `prompts` (token id lists)."""
    sampling = sampling or player.sampling
    tokens, lengths = _padded(prompts, sampling.pad_token_id)
    return _samples(generate(player.graphdef, player.params, tokens, lengths, key, sampling, player.mesh),
                    range(len(prompts)))


def reply_text(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> str:
    return tokenizer.decode(sample.ids[:-1] if sample.stopped else sample.ids, skip_special_tokens=True)


def model_prompts(player: Player, env: Environment, role: str,
                  episodes: Sequence[Episode]) -> list[RoleView | None]:
    """Grow each episode's view of `role` into the prompt of its next turn; None (view left as it was)
    where that prompt and a reply would not fit the player's context."""
    views, tools = [], template_tools(env, role)
    for episode in episodes:
        view = episode.views.setdefault(role, RoleView())
        segment = view.next_prompt(player.tokenizer, env.system_prompt(episode.scenario, role),
                                   episode.messages, role, tools)
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


@dataclasses.dataclass
class CacheLog:
    """The KV-cache counts of every call a speaker made through a `RolloutCache`, summed."""

    stats: CacheStats = CacheStats()


@dataclasses.dataclass
class RolloutCache:
    """One model speaker's per-row KV caches over one rollout (see the module docstring).

    rows: id(episode) -> (member, row): episode e is row `row` of member e.sim_index in a population
    (member 0 otherwise), in rollout order. cache: replaced by every call (kv_cache consumes it).
    """

    player: Player
    members: int | None
    rows: dict[int, tuple[int, int]]
    cache: kv_cache.RowCache
    log: CacheLog

    @classmethod
    def start(cls, player: Player, episodes: Sequence[Episode], members: int | None,
              cache_log: CacheLog) -> "RolloutCache":
        """An empty cache with a row for each of `episodes` (of member e.sim_index when `members`)."""
        per_member = [[e for e in episodes if members is None or e.sim_index == m]
                      for m in range(members or 1)]
        rows = max(map(len, per_member))
        groups = prefix_groups([[e.group for e in member] for member in per_member], rows)
        cache = kv_cache.create(player.graphdef, player.params, rows, groups=groups,
                                population=members is not None, mesh=player.mesh)
        return cls(player, members, {id(e): (m, r) for m, member in enumerate(per_member)
                                     for r, e in enumerate(member)}, cache, cache_log)

    def sample(self, episodes: Sequence[Episode], prompts: Sequence[RoleView],
               key: jax.Array) -> list[Sample]:
        """One `kv_cache.generate` call: each episode's row continues its view; the other rows sit out."""
        grid: list[list[Sequence[int] | None]] = [[None] * self.cache.layout.rows
                                                  for _ in range(self.members or 1)]
        for episode, view in zip(episodes, prompts, strict=True):
            member, row = self.rows[id(episode)]
            grid[member][row] = view.ids
        before, player = self.cache.stats, self.player
        out, self.cache = kv_cache.generate(player.graphdef, player.params, self.cache,
                                            grid if self.members else grid[0], key, player.sampling)
        call = CacheStats(*(int(now - then) for now, then in zip(dataclasses.astuple(self.cache.stats),
                                                                 dataclasses.astuple(before))))
        if call.fallbacks:
            log.warning("%d view(s) did not extend what their KV cache rows held (a template rewrote an "
                        "earlier turn?); their rows were re-prefilled (counted in rollout/cache_fallbacks)",
                        call.fallbacks)
        self.log.stats += call
        at = [self.rows[id(e)] for e in episodes]
        return _samples(out, at if self.members else [row for _, row in at])


def prefix_groups(member_groups: Sequence[Sequence[int]], rows: int) -> int:
    """How many groups of consecutive rows may share a prompt prefix: the GRPO groups (`Episode.group`)
    when every member's `rows` rows run through the same groups in order, in runs of equal length; else
    1 (the prefix common to all rows)."""
    first = list(member_groups[0])
    runs = [len(list(run)) for _, run in itertools.groupby(first)]
    regular = (first == sorted(first) and len(first) == rows and len(set(runs)) == 1
               and all(list(groups) == first for groups in member_groups))
    return len(runs) if regular else 1


@dataclasses.dataclass(frozen=True)
class ModelSpeaker:
    """One model voices the role in every episode: one batched generate call per turn (through the
    rollout's KV cache once `for_rollout` has given it one)."""

    player: Player
    cache_log: CacheLog = dataclasses.field(default_factory=CacheLog, kw_only=True, compare=False)
    rollout_cache: RolloutCache | None = dataclasses.field(default=None, kw_only=True, compare=False)

    @property
    def members(self) -> int | None:
        """P for a population (params stacked [P, ...]), None for one model."""
        return None

    def for_rollout(self, episodes: Sequence[Episode]) -> "ModelSpeaker":
        """This speaker with a fresh KV cache for the rollout of `episodes` (itself when kv_cache is off)."""
        if not self.player.kv_cache or not episodes:
            return self
        return dataclasses.replace(self, rollout_cache=RolloutCache.start(self.player, episodes, self.members,
                                                                          self.cache_log))

    def cache_stats(self) -> CacheStats:
        return self.cache_log.stats

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        views = model_prompts(self.player, env, role, episodes)
        live = [(e, v) for e, v in zip(episodes, views) if v is not None]
        if not live:
            return [None] * len(episodes)
        if self.rollout_cache is None:
            samples = self.reprefilled(live, key)
        else:
            samples = self.rollout_cache.sample(*zip(*live), key)
        return _replies(self.player, role, views, samples)

    def reprefilled(self, live: list[tuple[Episode, RoleView]], key: jax.Array) -> list[Sample]:
        """The samples of one generate call over the whole prompts."""
        return sample_replies(self.player, [v.ids for _, v in live], key)


@dataclasses.dataclass(frozen=True)
class PopulationSpeaker(ModelSpeaker):
    """P members of one architecture, stacked params [P, ...]: one vmapped generate call per turn, the
    episode e voiced by member e.sim_index (re-prefilling: each member's rows padded to the largest
    member's)."""

    population: int

    @property
    def members(self) -> int:
        return self.population

    def reprefilled(self, live: list[tuple[Episode, RoleView]], key: jax.Array) -> list[Sample]:
        by_member = [[v.ids for e, v in live if e.sim_index == m] for m in range(self.population)]
        rows = max(len(prompts) for prompts in by_member)
        width = max(len(v.ids) for _, v in live)
        padded = [_padded(prompts, self.player.sampling.pad_token_id, rows, width) for prompts in by_member]
        tokens, lengths = map(np.stack, zip(*padded))
        out = jax.device_get(generate_population(self.player.graphdef, self.player.params, tokens, lengths,
                                                 key, self.player.sampling, self.player.mesh))
        member_samples = [iter(_samples(jax.tree.map(lambda x: x[m], out), range(len(prompts))))
                          for m, prompts in enumerate(by_member)]
        return [next(member_samples[e.sim_index]) for e, _ in live]


@dataclasses.dataclass(frozen=True)
class MembersSpeaker:
    """Episode e is voiced by speakers[e.sim_index] (each called once per turn on its own episodes)."""

    speakers: tuple[Speaker, ...]

    def for_rollout(self, episodes: Sequence[Episode]) -> "MembersSpeaker":
        return MembersSpeaker(tuple(for_rollout(speaker, [e for e in episodes if e.sim_index == index])
                                    for index, speaker in enumerate(self.speakers)))

    def cache_stats(self) -> CacheStats:
        return sum(map(cache_stats, self.speakers), CacheStats())

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        replies: dict[int, Message | None] = {}
        for index, speaker in enumerate(self.speakers):
            mine = [i for i, e in enumerate(episodes) if e.sim_index == index]
            if mine:
                said = speaker(env, role, [episodes[i] for i in mine], jax.random.fold_in(key, index))
                replies.update(zip(mine, said))
        return [replies[i] for i in range(len(episodes))]


def for_rollout(speaker: Speaker, episodes: Sequence[Episode]) -> Speaker:
    """The speaker to use in the rollout of `episodes`: model speakers with a KV cache for it; speakers
    without a cache (scripted, verbalized) as they are."""
    start = getattr(speaker, "for_rollout", None)
    return speaker if start is None else start(episodes)


def cache_stats(speaker: Speaker) -> CacheStats:
    """What the speaker's KV caches did so far (zeros for a speaker without one)."""
    stats = getattr(speaker, "cache_stats", None)
    return CacheStats() if stats is None else stats()


@dataclasses.dataclass(frozen=True)
class ScriptedSpeaker:
    """The reply is `reply(episode)`: plain text, no sampled tokens (nothing of it is trained)."""

    reply: Callable[[Episode], str]

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        return [Message(role, self.reply(episode)) for episode in episodes]
