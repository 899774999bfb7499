"""The turn loop: scripted speakers in place of models on either side, an environment that names the next
speaker with per-role turn caps, speakers called once per turn with the episodes whose turn it is, and
prompts that no longer fit the context."""

import dataclasses

import jax
import numpy as np
import pytest

from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player, ScriptedSpeaker
from scope_jax.envs.target_word import TargetWordEnv
from scope_jax.models import init
from scope_jax.models.tiny import tiny_config, word_tokenizer
from scope_jax.sampling import SamplingConfig
from scope_jax.simulators.verbalized import VerbalizedConfig, VerbalizedSampler
from scope_jax.simulators.verbalized_speaker import VerbalizedSpeaker


@pytest.fixture(scope="module")
def player():
    """A tiny random model over the target-word vocabulary."""
    tok = word_tokenizer(TargetWordEnv().vocabulary)
    graphdef, params = init(tiny_config(len(tok)), seed=0)
    sampling = SamplingConfig(max_new_tokens=3, stop_token_ids=(tok.eos_token_id,), pad_token_id=0)
    return Player(graphdef, params, tok, sampling, max_context=256)


def episodes(env, n: int) -> list[Episode]:
    return [Episode(s, group=i) for i, s in enumerate(env.sample_scenarios(n, np.random.default_rng(0)))]


oracle = ScriptedSpeaker(lambda episode: f"{episode.scenario} {episode.scenario}")


def test_a_scripted_oracle_agent_runs_through_the_same_driver_as_a_model(player):
    env = TargetWordEnv(max_turns=2)
    played = rollout(env, episodes(env, 3), {AGENT: oracle, SIM: ModelSpeaker(player)}, jax.random.key(0))
    for episode in played:
        assert [m.role for m in episode.messages] == [SIM, AGENT, SIM, AGENT, SIM]  # the opening, then turns
        assert episode.end_reason == "turn_limit" and set(episode.views) == {SIM}  # no view of the script
        assert all(m.sampled_ids is None for m in episode.messages if m.role == AGENT)
        sim = episode.views[SIM]
        assert len(sim.prompt_lengths) == 2 and sum(sim.loss_mask) > 0
    assert all(e.rewards == {"agent": 1.0, "sim": 1.0} for e in played)  # it says the word every turn


def test_both_sides_scripted_need_no_model():
    env = TargetWordEnv(max_turns=3)
    user = ScriptedSpeaker(lambda episode: f"say {episode.scenario} again")
    played = rollout(env, episodes(env, 2), {AGENT: oracle, SIM: user}, jax.random.key(0))
    for episode in played:
        word = episode.scenario
        assert [m.text for m in episode.messages[1:3]] == [f"{word} {word}", f"say {word} again"]
        assert episode.turns_taken == {AGENT: 3, SIM: 3} and not episode.views  # the opening is not a turn


@dataclasses.dataclass
class ToolEnv(TargetWordEnv):
    """A scenario "tool" answers the agent's first turn with a tool result only the agent sees and lets the
    agent act again; the agent may take 3 turns, the simulator 1."""

    targets: tuple[str, ...] = ("tool", "plain")
    max_turns: dict = dataclasses.field(default_factory=lambda: {AGENT: 3, SIM: 1})

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        if episode.scenario == "tool" and message.role == AGENT and episode.turns_taken[AGENT] == 1:
            return TurnResult([Message(ENV, "result", visible_to=(AGENT,))], next_speaker=AGENT)
        return TurnResult()


@dataclasses.dataclass
class Recording:
    """A scripted speaker that records which episodes each call got."""

    calls: list = dataclasses.field(default_factory=list)

    def __call__(self, env, role, batch, key):
        self.calls.append((role, [e.scenario for e in batch]))
        return [Message(role, "ok") for _ in batch]


def test_the_environment_names_the_next_speaker_and_each_role_has_its_own_cap():
    env = ToolEnv()
    batch = [Episode("tool", group=0), Episode("plain", group=1)]
    speaker = Recording()
    rollout(env, batch, {AGENT: speaker, SIM: speaker}, jax.random.key(0))
    tool, plain = batch
    assert [m.role for m in tool.messages] == [SIM, AGENT, ENV, AGENT, SIM, AGENT]
    assert [m.role for m in plain.messages] == [SIM, AGENT, SIM, AGENT]
    assert tool.end_reason == plain.end_reason == "turn_limit"  # the simulator's one turn is used up
    assert tool.turns_taken == {AGENT: 3, SIM: 1} and plain.turns_taken == {AGENT: 2, SIM: 1}
    # one call per role and round, with the episodes whose turn it is
    assert speaker.calls == [(AGENT, ["tool", "plain"]), (AGENT, ["tool"]), (SIM, ["plain"]),
                             (AGENT, ["plain"]), (SIM, ["tool"]), (AGENT, ["tool"])]


def test_a_prompt_that_does_not_fit_ends_the_episode_and_leaves_its_view(player):
    env = TargetWordEnv(max_turns=3)
    small = dataclasses.replace(player, max_context=30)  # the first prompts fit, later ones do not
    played = rollout(env, episodes(env, 2), {AGENT: ModelSpeaker(small), SIM: oracle}, jax.random.key(1))
    for episode in played:
        assert episode.end_reason == "context_limit" and episode.turns_taken[AGENT] >= 1
        view = episode.views[AGENT]
        assert len(view) == view.prompt_lengths[-1] + len(episode.messages[-2].sampled_ids)  # its last reply
        assert all(small.fits(n) for n in view.prompt_lengths)


def test_verbalized_prompts_go_through_the_context_check(player):
    """The verbalized request makes the simulator's prompt longer than the plain one: with room for the
    plain prompt only, the episode ends at the context limit instead of generating past it."""
    env = TargetWordEnv(max_turns=1)
    config = VerbalizedConfig(max_retries=0)
    roomy = VerbalizedSpeaker(dataclasses.replace(player, max_context=512), VerbalizedSampler(config), 8)
    played = rollout(env, episodes(env, 2), {AGENT: oracle, SIM: roomy}, jax.random.key(0))
    assert all(e.end_reason == "turn_limit" and len(e.info["verbalized"]) == 1 for e in played)
    tight = VerbalizedSpeaker(dataclasses.replace(player, max_context=40), VerbalizedSampler(config), 8)
    played = rollout(env, episodes(env, 2), {AGENT: oracle, SIM: tight}, jax.random.key(0))
    assert all(e.end_reason == "context_limit" and "verbalized" not in e.info for e in played)
