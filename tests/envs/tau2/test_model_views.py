"""The role views model speakers grow in a tau2 episode, under Qwen3's chat template (word-level tokenizer):
the agent's tools in its system turn, tool results as the template's tool turns, the user's view free of
tool traffic, and the agent's loss mask on its own sampled tokens (tool-call text included) only."""

import dataclasses
from typing import Callable

import jax

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import Player, model_prompts
from scope_jax.sampling import SamplingConfig
from tests.dialogue.test_qwen3_template import THINK, qwen3_tokenizer, tokens
from tests.envs.tau2.test_environment import LOOKUP, lines, task

TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")


@dataclasses.dataclass(frozen=True)
class SampledScript:
    """A model speaker with scripted replies: grows the role's view like a model speaker and "samples"
    the reply's tokens (stop token included), so the view holds them as the role's own."""

    player: Player
    reply: Callable[[Episode], str]

    def __call__(self, env, role, episodes, key):
        tok, replies = self.player.tokenizer, []
        for episode, view in zip(episodes, model_prompts(self.player, env, role, episodes)):
            text = self.reply(episode)
            ids = tuple(tok(text, add_special_tokens=False).input_ids) + (tok.eos_token_id,)
            message = Message(role, text, sampled_ids=ids, logprobs=(-1.0,) * len(ids), stopped=True)
            view.add_reply(message)
            replies.append(message)
        return replies


def play_with_views(env):
    tok = qwen3_tokenizer(THINK + TAGS + ("hi", "Done.", "###STOP###"))
    player = Player(None, None, tok, SamplingConfig(), max_context=100_000)
    episode = Episode(task(env), group=0)
    speakers = {AGENT: SampledScript(player, lines(LOOKUP, "Done.")),
                SIM: SampledScript(player, lines("hi", "###STOP###"))}
    rollout(env, [episode], speakers, jax.random.key(0))
    return tok, episode


def test_template_format_views(make_env):
    env = make_env(tool_format="template")
    tok, episode = play_with_views(env)
    assert episode.end_reason == "user_stop"
    results = [m for m in episode.messages if m.role == ENV]
    assert len(results) == 1 and results[0].tool_result and results[0].visible_to == (AGENT,)

    agent = tokens(tok, episode.views[AGENT].ids)
    system = agent[:agent.index("<|im_end|>")]
    assert "<tools>" in system and "</tools>" in system  # env.template_tools(AGENT) reached the template
    start = agent.index("<tool_response>")
    assert agent[start - 2:start] == ["<|im_start|>", "user"]  # Qwen3 puts tool turns in a user turn
    assert agent[start + 1:].index("</tool_response>") > 0 and agent.count("<tool_response>") == 1

    user = tokens(tok, episode.views[SIM].ids)
    assert not set(TAGS) & set(user)  # no tools, no call, no result in the user's view

    for role in (AGENT, SIM):
        view = episode.views[role]
        own = [m for m in episode.messages if m.role == role and m.sampled_ids]
        trained = [i for i, m in enumerate(view.loss_mask) if m]
        spans = [i for n, m in zip(view.prompt_lengths, own) for i in range(n, n + len(m.sampled_ids))]
        assert trained == spans
    first = episode.views[AGENT].prompt_lengths[0]
    assert agent[first] == "<tool_call>" and episode.views[AGENT].loss_mask[first] == 1.0


def test_text_format_views(make_env):
    env = make_env(tool_format="text")
    template = make_env()
    assert env.template_tools(AGENT) == [] and template.template_tools(AGENT) == template.tool_schemas(AGENT)
    tok, episode = play_with_views(env)
    result = [m for m in episode.messages if m.role == ENV][0]
    assert not result.tool_result  # a user turn that carries the <tool_response> tags itself
    agent = tokens(tok, episode.views[AGENT].ids)
    system = agent[:agent.index("<|im_end|>")]
    assert system.count("<tools>") == 1  # the prompt's own listing; the template was given no tools
