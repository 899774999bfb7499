"""Model seats: each seat's token view through the loop's own view code, forks, held-out tasks."""

import copy
import dataclasses
import types

import jax
import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import Player, Sample, _replies, model_prompts
from scope_jax.envs.cooperbench.environment import SESSION, CooperBenchEnv
from scope_jax.envs.cooperbench.tools import format_call
from scope_jax.sampling import SamplingConfig
from scope_jax.training.rl_step import make_episodes
from tests.envs.cooperbench.conftest import TASK

NOTES = {AGENT: "AGENT-NOTE: I append sort at the end.", SIM: "PARTNER-NOTE: then I add uniq after it."}
SCRIPTS = {role: [format_call("send_message", text=note), format_call("finish")]
           for role, note in NOTES.items()}
LOGPROB = -0.5


@pytest.fixture(scope="module")
def tokenizer():
    players = pytest.importorskip("scope_jax.training.players")
    try:
        return players.load_model("smollm2-135m-instruct")[2]
    except FileNotFoundError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not installed: {e}")


@dataclasses.dataclass(frozen=True)
class ScriptedModelSpeaker:
    """A model speaker whose samples are scripted replies (their tokens plus the stop token): the views
    grow by the loop's own code (model_prompts, then the replies), with replies a test chooses."""

    player: Player

    def __call__(self, env, role, episodes, key):
        views = model_prompts(self.player, env, role, episodes)
        samples = []
        for episode, view in zip(episodes, views):
            if view is not None:
                text = SCRIPTS[role][episode.turns_taken.get(role, 0)]
                ids = self.player.tokenizer(text, add_special_tokens=False).input_ids
                ids = (*ids, self.player.tokenizer.eos_token_id)
                samples.append(Sample(ids, (LOGPROB,) * len(ids), True))
        return _replies(self.player, role, views, samples)


@pytest.fixture
def env():
    env = CooperBenchEnv(isolation="process", max_turns=2)
    yield env
    env.close()


def _pair(env):
    return next(p for p in env.pairs if p.task.name == TASK)


def test_messages_are_in_both_views_and_each_seat_trains_on_its_own_tokens(env, tokenizer):
    player = Player(None, None, tokenizer, SamplingConfig(max_new_tokens=64), max_context=4096)
    speaker = ScriptedModelSpeaker(player)
    episode = rollout(env, [Episode(_pair(env), 0)], {AGENT: speaker, SIM: speaker}, jax.random.key(0))[0]
    assert episode.end_reason == "finished" and [m.role for m in episode.messages if m.role != "env"] == [
        AGENT, SIM, AGENT, SIM]
    for me, partner in ((AGENT, SIM), (SIM, AGENT)):
        view = episode.views[me]
        ids, mask, logprobs = (np.asarray(x) for x in (view.ids, view.loss_mask, view.logprobs))
        own = [t for m in episode.messages if m.role == me for t in m.sampled_ids]
        assert ids[mask == 1].tolist() == own  # trained: exactly its own sampled tokens, in order
        np.testing.assert_array_equal(logprobs, np.where(mask == 1, LOGPROB, 0.0))
        text = tokenizer.decode(ids.tolist())
        context = tokenizer.decode(ids[mask == 0].tolist())
        assert NOTES[me] in tokenizer.decode(own)  # its own message, as it sent it (trained)
        assert f"[Message from your partner]: {NOTES[partner]}" in context  # the partner's, as context
        assert SCRIPTS[partner][0] not in text  # the partner's own tool call stays private


def test_a_forked_episode_gets_its_own_worktrees(env):
    pair = _pair(env)
    episode = Episode(pair, 0, messages=env.opening(pair))
    path = "linetools/notes.py"

    def turn(e, role, text):
        message = Message(role, text)
        e.messages.append(message)
        e.messages.extend(env.after_turn(e, message).messages)

    turn(episode, AGENT, format_call("write_file", path=path, content="ORIGINAL = 1\n"))
    fork = copy.deepcopy(episode)
    seats = episode.info[SESSION][AGENT], fork.info[SESSION][AGENT]
    assert seats[0].worktree != seats[1].worktree
    assert (seats[1].worktree / path).read_text() == "ORIGINAL = 1\n"  # the copy starts where it forked
    turn(fork, AGENT, format_call("write_file", path=path, content="FORK = 2\n"))
    assert (seats[0].worktree / path).read_text() == "ORIGINAL = 1\n"
    assert fork.info[SESSION][SIM].worktree != episode.info[SESSION][SIM].worktree
    for e in (episode, fork):  # each is evaluated and removes its own worktrees
        env.rewards(e)
    assert not any(seat.worktree.exists() for seat in seats)
    records = [e.info["cooperbench"]["patches"][AGENT] for e in (episode, fork)]
    assert "+ORIGINAL = 1" in records[0] and "+FORK = 2" in records[1]


def test_held_out_tasks_make_the_eval_split():
    env = CooperBenchEnv(isolation="process", eval_tasks=("markup", "stats"))
    try:
        rng = np.random.default_rng(0)
        train = {p.task.name for p in env.sample_scenarios(200, rng, "train")}
        held_out = {p.task.name for p in env.sample_scenarios(50, rng, "eval")}
        assert held_out == {"markup", "stats"}
        assert train == {t.name for t in env.tasks} - held_out
    finally:
        env.close()
    with pytest.raises(ValueError, match="eval_tasks nope are not tasks"):
        CooperBenchEnv(eval_tasks=("markup", "nope"))
    everything = tuple(t.name for t in env.tasks)
    with pytest.raises(ValueError, match="holds out every task"):
        CooperBenchEnv(eval_tasks=everything)


def test_a_grpo_group_shares_its_pair_and_seat_order():
    env = CooperBenchEnv(isolation="process", swap_seats=True)
    try:
        setup = types.SimpleNamespace(env=env, config=types.SimpleNamespace(
            seed=0, rollout=types.SimpleNamespace(group_size=3)),
            mode=types.SimpleNamespace(assign=lambda step, size: np.zeros(size, int)))
        episodes = make_episodes(setup, 0, "train", 40)
        for g in range(40):
            scenarios = {(str(e.scenario.task.name), e.scenario.features) for e in episodes if e.group == g}
            assert len(scenarios) == 1
        orders = [e.scenario.features for e in episodes]
        assert any(a < b for a, b in orders) and any(a > b for a, b in orders)  # seats drawn per group
        swapped = next(e.scenario for e in episodes if e.scenario.features[0] > e.scenario.features[1])
        assert swapped.task.feature(swapped.features[0]).spec in env.system_prompt(swapped, AGENT)
        assert all(a < b for a, b in (e.scenario.features for e in make_episodes(setup, 0, "eval", 20)))
    finally:
        env.close()
