"""Role views under Qwen3's real chat template, on a tiny word-level tokenizer.

tests/fixtures/qwen3_chat_template.jinja is the chat template of Qwen/Qwen3-0.6B as released (the same
in 1.7B and 4B). Two of its habits matter here: its generation prompt lets the model open a `<think>`
block unless `enable_thinking=False`, which then writes an empty one; and it renders an assistant turn
with that empty think block only when the turn comes after the last user turn, so earlier turns change
once the dialogue goes on.
"""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player
from scope_jax.dialogue.views import RoleView, prompt_ids
from scope_jax.envs.target_word import TargetWordEnv
from scope_jax.models import init
from scope_jax.models.tiny import word_tokenizer, tiny_config
from scope_jax.models.tokenizer import THINKING_OFF, without_thinking
from scope_jax.sampling import SamplingConfig

QWEN3_TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "qwen3_chat_template.jinja").read_text()
THINK = ("<think>", "</think>")
WORDS = ("hello", "give", "one", "dollar", "no", "thanks", "how", "much")


def qwen3_tokenizer(words: tuple[str, ...]):
    """A word-level tokenizer over `words` with Qwen3's template, thinking off (as players load it)."""
    return without_thinking(word_tokenizer(THINK + words, chat_template=QWEN3_TEMPLATE))


def tokens(tok, ids) -> list[str]:
    return tok.convert_ids_to_tokens(list(ids))


def test_generation_prompt_opens_no_think_block_unless_asked():
    chat = [{"role": "system", "content": "persuade"}, {"role": "user", "content": "hello"}]
    raw = word_tokenizer(THINK + WORDS, chat_template=QWEN3_TEMPLATE)
    assert tokens(raw, raw.apply_chat_template(chat, add_generation_prompt=True)["input_ids"])[-2:] == [
        "<|im_start|>", "assistant"]  # Qwen3 as released: the model may open <think> itself

    tok = qwen3_tokenizer(WORDS)
    prompt = tokens(tok, tok.apply_chat_template(chat, add_generation_prompt=True)["input_ids"])
    assert prompt[-4:] == ["<|im_start|>", "assistant", "<think>", "</think>"]  # closed: thinking is off
    asked = tok.apply_chat_template(chat, add_generation_prompt=True, enable_thinking=True)["input_ids"]
    assert tokens(tok, asked)[-2:] == ["<|im_start|>", "assistant"]
    assert tokens(tok, prompt_ids(tok, "persuade", [Message(SIM, "hello")], AGENT)) == prompt

    assert without_thinking(tok).chat_template == THINKING_OFF + QWEN3_TEMPLATE  # applied once
    assert without_thinking(word_tokenizer(WORDS)).chat_template == word_tokenizer(WORDS).chat_template


def _sample(tok, rng, stopped: bool) -> tuple[int, ...]:
    words = tok.convert_tokens_to_ids(list(rng.choice(WORDS, 3)))
    return tuple(words) + ((tok.eos_token_id,) if stopped else ())


def test_every_prompt_is_a_prefix_of_the_later_views():
    """Three turns each, the persuadee answering a closing question only it sees (it speaks last, after
    the last user turn of its view); one reply runs out of tokens without its stop token."""
    tok = qwen3_tokenizer(WORDS)
    rng = np.random.default_rng(0)
    system = {AGENT: "persuade", SIM: "you are a person"}
    views = {AGENT: RoleView(), SIM: RoleView()}
    messages: list[Message] = []
    prompts = {AGENT: [], SIM: []}
    for turn, role in enumerate([AGENT, SIM] * 3 + [ENV, SIM]):
        if role == ENV:
            messages.append(Message(ENV, "how much", visible_to=(SIM,)))
            continue
        views[role].add_prompt(views[role].next_prompt(tok, system[role], messages, role))
        prompts[role].append(tuple(views[role].ids))
        sampled = _sample(tok, rng, stopped=turn != 3)
        messages.append(Message(role, " ".join(tok.convert_ids_to_tokens(sampled)), sampled_ids=sampled,
                                logprobs=(-1.0,) * len(sampled), stopped=turn != 3))
        views[role].add_reply(messages[-1])

    for role, view in views.items():
        own = [m for m in messages if m.role == role]
        for prompt, message in zip(prompts[role], own):
            n = len(prompt)
            assert tuple(view.ids[:n]) == prompt
            assert tokens(tok, prompt)[-2:] == list(THINK)  # answered with thinking off
            assert tuple(view.ids[n:n + len(message.sampled_ids)]) == message.sampled_ids
            assert all(view.loss_mask[n:n + len(message.sampled_ids)])
        assert sum(view.loss_mask) == sum(len(m.sampled_ids) for m in own)

    # What a single rendering of the finished dialogue would train on instead: the template has dropped
    # the empty think block from the agent's first turn, so its first prompt is not a prefix of it.
    chat = [{"role": "system", "content": system[AGENT]}] + [
        {"role": "assistant" if m.role == AGENT else "user", "content": m.text}
        for m in messages if AGENT in m.visible_to]
    whole = tok.apply_chat_template(chat)["input_ids"]
    first = prompts[AGENT][0]
    assert tuple(whole[:len(first)]) != first


@dataclasses.dataclass
class ClosingTargetWord(TargetWordEnv):
    """Target word with P4G's closing question: the simulator answers one extra turn at the end."""

    def closing(self, episode: Episode) -> list[Message]:
        return [Message(ENV, "how much", visible_to=(SIM,))]


@pytest.mark.parametrize("max_new_tokens", [3, 6])  # 3: most replies end without their stop token
def test_rollout_views_with_the_qwen3_template(max_new_tokens):
    env = ClosingTargetWord(max_turns=2)
    tok = qwen3_tokenizer(env.vocabulary + ("how", "much"))
    graphdef, params = init(tiny_config(len(tok)), seed=0)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,),
                              pad_token_id=tok.pad_token_id)
    speaker = ModelSpeaker(Player(graphdef, params, tok, sampling, max_context=1024))
    episodes = [Episode(s, group=i) for i, s in enumerate(env.sample_scenarios(4, np.random.default_rng(0)))]
    rollout(env, episodes, {AGENT: speaker, SIM: speaker}, jax.random.key(0))
    for episode in episodes:
        assert [m.role for m in episode.messages][-2:] == [ENV, SIM]
        for role in (AGENT, SIM):
            view = episode.views[role]
            own = [m for m in episode.messages if m.role == role and m.sampled_ids]
            assert len(own) == len(view.prompt_lengths) == (2 if role == AGENT else 3)  # + the env's opening
            assert sum(view.loss_mask) == sum(len(m.sampled_ids) for m in own)
            for n, message in zip(view.prompt_lengths, own):  # each reply right after its prompt
                assert tuple(view.ids[n:n + len(message.sampled_ids)]) == message.sampled_ids
            assert tokens(tok, view.ids[:view.prompt_lengths[0]])[-2:] == list(THINK)
