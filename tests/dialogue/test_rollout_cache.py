"""The rollout through per-row KV caches (`rollout.kv_cache`, the default) against re-prefilling every
prompt (`Player.kv_cache = False`), end to end through the turn loop: greedy tiny models on both sides, rows
of different lengths, GRPO groups that share a prompt prefix, an environment that gives the agent a tool
result and the turn again (next_speaker repeats), episodes that end at different turns, and a closing
question. The sampled tokens must be identical; the log-probs equal to float32 round-off (atol 2e-5:
the cached path attends over the shared prefix and the row's cache in one online softmax, which sums in
another order). On one device, on 8 fake devices with a mesh, and with a population simulator; and the
behaviour log-probs the cached rollout records are the ones the training recomputation gives over the final
views. A view that stops being an extension of its row's cache is re-prefilled, counted and logged."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding
from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import (CacheLog, ModelSpeaker, Player, PopulationSpeaker, RolloutCache,
                                         cache_stats, sample_replies)
from scope_jax.dialogue.views import RoleView
from scope_jax.envs.target_word import TargetWordEnv
from scope_jax.logprobs import token_logprobs
from scope_jax.models import PARTITION_RULES, init
from scope_jax.models.tiny import tiny_config, word_tokenizer
from scope_jax.sampling import SamplingConfig

ATOL = 2e-5
# Two episodes per GRPO group, of different scenarios: rows of one group differ after their common prefix.
SCENARIOS = ("apple", "banana", "cherry", "grape", "apple", "cherry")


@dataclasses.dataclass
class ToolEnv(TargetWordEnv):
    """apple: each agent turn but the last gets a tool result (only the agent sees it, longer each time) and
    the agent speaks again; cherry: the episode ends after the agent's second turn; the others run to the
    turn caps and get a closing question."""

    max_turns: dict = dataclasses.field(default_factory=lambda: {AGENT: 3, SIM: 2})

    def system_prompt(self, scenario, role: str) -> str:
        return "you say the word the user asks for, now" if role == AGENT else f"ask for {scenario} please"

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        turns = episode.turns_taken[AGENT]
        if message.role == AGENT and episode.scenario == "apple" and turns < 3:
            return TurnResult([Message(ENV, " ".join(["ok"] * (2 * turns)), visible_to=(AGENT,))],
                              next_speaker=AGENT)
        if message.role == AGENT and episode.scenario == "cherry" and turns == 2:
            return TurnResult(done=True, reason="env")
        return TurnResult()

    def closing(self, episode: Episode) -> list[Message]:
        return [Message(ENV, "what now", visible_to=(SIM,))]


ENV_ = ToolEnv()
TOKENIZER = word_tokenizer(ENV_.vocabulary)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=3, stop_token_ids=(TOKENIZER.eos_token_id,),
                        pad_token_id=0)


def model(seed: int):
    """A tiny model with a scaled-up head: peaked next-token distributions, so no greedy near-ties."""
    graphdef, params = init(tiny_config(len(TOKENIZER)), seed=seed)
    params["embed_tokens"]["embedding"] = params["embed_tokens"]["embedding"] * 4.0
    return graphdef, params


@pytest.fixture(scope="module")
def models():
    return model(0), model(1), model(2)


def player(graphdef, params, kv: bool, mesh=None) -> Player:
    return Player(graphdef, params, TOKENIZER, GREEDY, max_context=512, mesh=mesh, kv_cache=kv)


def played(agent: ModelSpeaker, sim: ModelSpeaker, sim_index=lambda i: 0) -> list[Episode]:
    episodes = [Episode(s, group=i // 2, sim_index=sim_index(i)) for i, s in enumerate(SCENARIOS)]
    return rollout(ENV_, episodes, {AGENT: agent, SIM: sim}, jax.random.key(0))


def assert_same_dialogues(cached: list[Episode], again: list[Episode]) -> None:
    for a, b in zip(cached, again, strict=True):
        assert a.end_reason == b.end_reason and a.turns_taken == b.turns_taken
        assert [m.text for m in a.messages] == [m.text for m in b.messages]
        for role in (AGENT, SIM):
            assert a.views[role].ids == b.views[role].ids, (a.scenario, role)
            np.testing.assert_allclose(a.views[role].logprobs, b.views[role].logprobs, atol=ATOL)


def common_length(rows: list[list[int]]) -> int:
    n = 0
    while all(len(r) > n and r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def assert_agent_cache_counts(speaker, episodes: list[Episode]) -> None:
    """The agent's cache counts, derived from its final views: every row takes part in the first call, so
    its group's shared prefix is the longest common prefix of the group's first prompts (each without its
    last token); a row's first call prefills its prompt after that prefix, and each later call what its
    view added since the previous call ended (the cache holds the previous prompt and reply, less the
    reply's last token, which decoding never feeds back)."""
    views = [e.views[AGENT] for e in episodes]
    prefix = {}
    for group in {e.group for e in episodes}:
        rows = [v for e, v in zip(episodes, views) if e.group == group]
        prefix[group] = common_length([v.ids[:v.prompt_lengths[0] - 1] for v in rows])
    prefilled = reused = 0
    for episode, view in zip(episodes, views):
        starts = [prefix[episode.group]]  # the cached length at each call
        for k in range(1, len(view.prompt_lengths)):
            reply = int(sum(view.loss_mask[view.prompt_lengths[k - 1]:view.prompt_lengths[k]]))
            starts.append(view.prompt_lengths[k - 1] + reply - 1)
        reused += sum(starts)
        prefilled += sum(n - start for n, start in zip(view.prompt_lengths, starts))
    stats = cache_stats(speaker)
    assert stats.fallbacks == 0
    assert stats.shared == sum(prefix.values()) > 0
    assert (stats.prefilled, stats.reused) == (prefilled, reused)


@pytest.fixture(scope="module")
def reprefilled(models):
    """The rollout with both roles re-prefilling every prompt, on one device."""
    (g0, p0), (g1, p1), _ = models
    return played(ModelSpeaker(player(g0, p0, False)), ModelSpeaker(player(g1, p1, False)))


@pytest.fixture(scope="module")
def cached(models):
    """(episodes, agent speaker, simulator speaker) of the rollout through the KV caches, on one device."""
    (g0, p0), (g1, p1), _ = models
    agent, sim = ModelSpeaker(player(g0, p0, True)), ModelSpeaker(player(g1, p1, True))
    return played(agent, sim), agent, sim


def test_the_cached_rollout_equals_re_prefilling(cached, reprefilled):
    episodes, agent, sim = cached
    assert_same_dialogues(episodes, reprefilled)
    # the rollout is what this test is about: repeats, different ends and lengths, the closing turn
    apple, banana, cherry = episodes[0], episodes[1], episodes[2]
    assert [m.role for m in apple.messages[:5]] == [SIM, AGENT, ENV, AGENT, ENV]
    assert cherry.end_reason == "env" and banana.end_reason == "turn_limit"
    assert banana.messages[-1].role == SIM and banana.messages[-2].text == "what now"
    assert len({len(e.views[AGENT]) for e in episodes}) > 1
    assert_agent_cache_counts(agent, episodes)
    assert cache_stats(sim).fallbacks == 0 and cache_stats(sim).shared > 0


def test_on_8_devices_the_cached_rollout_equals_re_prefilling_on_one(models, reprefilled):
    (g0, p0), (g1, p1), _ = models
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    place = lambda params: jax.device_put(params, sharding.named_shardings(params, PARTITION_RULES, mesh))
    agent = ModelSpeaker(player(g0, place(p0), True, mesh))
    episodes = played(agent, ModelSpeaker(player(g1, place(p1), True, mesh)))
    assert_same_dialogues(episodes, reprefilled)
    assert_agent_cache_counts(agent, episodes)


def test_a_population_simulator_through_the_cache_equals_re_prefilling(models):
    (g0, p0), (g1, p1), (_, p2) = models
    stacked = jax.tree.map(lambda *x: jnp.stack(x), p1, p2)
    member = lambda i: i % 2  # both members in every group
    sim = PopulationSpeaker(player(g1, stacked, True), 2)
    cached = played(ModelSpeaker(player(g0, p0, True)), sim, member)
    again = played(ModelSpeaker(player(g0, p0, False)), PopulationSpeaker(player(g1, stacked, False), 2),
                   member)
    assert_same_dialogues(cached, again)
    assert cache_stats(sim).fallbacks == 0 and cache_stats(sim).calls > 1
    # each member voiced its own episodes: its model reproduces their log-probs, the other does not
    views = [e.views[SIM] for e in cached]
    for m, params in enumerate((p1, p2)):
        for i, (recomputed, view) in enumerate(zip(recompute(g1, params, views), views)):
            mask = np.asarray(view.loss_mask) > 0
            voiced = np.allclose(recomputed[mask], np.asarray(view.logprobs)[mask], atol=1e-4)
            assert voiced == (m == member(i)), (m, i)


recompute_jit = jax.jit(token_logprobs, static_argnums=0)


def recompute(graphdef, params, views) -> list[np.ndarray]:
    """The training forward's log-prob of each token of each view, in one batch (right-padded)."""
    tokens = np.zeros((len(views), max(map(len, views))), np.int32)
    for row, view in enumerate(views):
        tokens[row, :len(view)] = view.ids
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    logprobs = np.asarray(recompute_jit(graphdef, params, tokens, positions).logprobs)
    return [row[:len(view)] for row, view in zip(logprobs, views)]


def test_behaviour_logprobs_of_the_cached_rollout_are_the_training_recomputation(models, cached):
    """Greedy rows record the model's own (temperature 1) log-prob of each sampled token: the training
    forward over the whole final view must give them back."""
    (g0, p0), (g1, p1), _ = models
    for role, (graphdef, params) in ((AGENT, (g0, p0)), (SIM, (g1, p1))):
        views = [e.views[role] for e in cached[0]]
        for recomputed, view in zip(recompute(graphdef, params, views), views):
            mask = np.asarray(view.loss_mask) > 0
            np.testing.assert_allclose(recomputed[mask], np.asarray(view.logprobs)[mask], atol=ATOL)


def test_a_view_that_stopped_being_an_extension_is_re_prefilled_counted_and_logged(models, caplog):
    (g0, p0), _, _ = models
    episodes = [Episode(s, group=i // 2) for i, s in enumerate(SCENARIOS)]
    cache_log = CacheLog()
    cache = RolloutCache.start(player(g0, p0, True), episodes, None, cache_log)
    rng = np.random.default_rng(0)
    views = [RoleView(ids=[int(t) for t in rng.integers(3, len(TOKENIZER), 12 + i)]) for i in range(6)]
    first = cache.sample(episodes, views, jax.random.key(0))
    for view, sample in zip(views, first):
        view.ids += list(sample.ids) + [5, 6]
    views[4].ids[8] = 3 if views[4].ids[8] != 3 else 4  # an earlier token rewritten
    with caplog.at_level(logging.WARNING, logger="scope_jax.dialogue.speakers"):
        later = cache.sample(episodes[3:5], views[3:5], jax.random.key(1))
    assert cache_log.stats.fallbacks == 1 and "re-prefilled" in caplog.text
    again = sample_replies(player(g0, p0, False), [v.ids for v in views[3:5]], jax.random.key(1))
    for a, b in zip(later, again, strict=True):
        assert a.ids == b.ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=ATOL)
