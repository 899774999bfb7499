"""Role views grown turn by turn: hand-built token sequences, a fresh rendering of HF's chat template as the
independent reference, and the refusal of a history that changed under a view."""

import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, SIM, Message
from scope_jax.dialogue.views import RoleView, ViewError, prompt_ids
from scope_jax.models.tiny import word_tokenizer

WORDS = ("say", "apple", "pear", "yes", "no", "ok")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS)


def ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def grow(tok, view: RoleView, system: str, messages: list[Message], me: str) -> list[int]:
    """Extend `view` to the prompt of `me`'s next turn; returns the tokens added."""
    segment = view.next_prompt(tok, system, messages, me)
    view.add_prompt(segment)
    return list(segment.ids)


def test_own_tokens_are_the_sampled_ids_and_only_they_are_trained(tok):
    end = tok.eos_token_id
    start, user, assistant = tok.convert_tokens_to_ids(["<|im_start|>", "user", "assistant"])
    # The agent sampled "apple <unk>" then stopped: <unk> decodes to nothing, so the text is "apple" and a
    # re-tokenisation would lose a token. The view must keep the sampled ids.
    sampled = (tok.convert_tokens_to_ids("apple"), tok.unk_token_id, end)
    messages = [Message(SIM, "say apple")]
    view = RoleView()
    grow(tok, view, "be nice", messages, AGENT)
    reply = Message(AGENT, "apple", sampled_ids=sampled, logprobs=(-1.0, -2.0, -0.5), stopped=True)
    view.add_reply(reply)
    messages += [reply, Message(SIM, "ok")]
    prompt = ([start, tok.convert_tokens_to_ids("system")] + ids(tok, "be nice") + [end]
              + [start, user] + ids(tok, "say apple") + [end] + [start, assistant])
    assert view.ids == prompt + list(sampled) and view.prompt_lengths == [len(prompt)]
    assert [i for i, m in enumerate(view.loss_mask) if m] == [len(prompt), len(prompt) + 1, len(prompt) + 2]
    assert view.logprobs == [0.0] * len(prompt) + [-1.0, -2.0, -0.5]
    # The next prompt adds only what is new; the template's own copy of the sampled stop token is dropped.
    tail = [start, user] + ids(tok, "ok") + [end, start, assistant]
    assert grow(tok, view, "be nice", messages, AGENT) == tail
    assert view.prompt_lengths == [len(prompt), len(view)] and sum(view.loss_mask) == 3


def test_simulator_sees_roles_flipped(tok):
    messages = [Message(SIM, "say pear", sampled_ids=tuple(ids(tok, "say pear")), logprobs=(-1.0, -1.0)),
                Message(AGENT, "pear")]
    text = tok.decode(prompt_ids(tok, "ask", messages, SIM))
    assert text.index("assistant say pear") < text.index("user pear")
    assert text.endswith("assistant")  # the generation prompt of the simulator's next turn


def test_unstopped_turn_gets_template_end_untrained(tok):
    view = RoleView()
    grow(tok, view, "s", [], AGENT)
    reply = Message(AGENT, "yes yes", sampled_ids=tuple(ids(tok, "yes yes")), logprobs=(-1.0, -1.0))
    view.add_reply(reply)
    tail = view.next_prompt(tok, "s", [reply], AGENT)
    assert tail.ids[0] == tok.eos_token_id and tail.loss_mask[0] == 0.0  # the template closes the turn
    assert sum(view.loss_mask) == 2


def test_hidden_messages_are_not_in_the_other_view(tok):
    messages = [Message("env", "ok", visible_to=(AGENT,))]
    okay = tok.convert_tokens_to_ids("ok")
    assert okay in prompt_ids(tok, "s", messages, AGENT) and okay not in prompt_ids(tok, "s", messages, SIM)


def test_grown_views_are_fresh_renderings_of_the_chat_template(tok):
    """With a template that renders past turns the same way (ChatML), every prompt of a grown view equals
    HF's own rendering of the chat so far, tokenised as text (sampled words re-tokenise to themselves);
    every earlier prompt is a prefix of the final view, and only sampled tokens are trained."""
    rng = np.random.default_rng(0)
    system = {AGENT: "say the word", SIM: "ask"}
    views = {AGENT: RoleView(), SIM: RoleView()}
    messages: list[Message] = [Message(SIM, "say apple")]
    prompts = {AGENT: [], SIM: []}
    for turn, role in enumerate([AGENT, SIM] * 3):
        grow(tok, views[role], system[role], messages, role)
        chat = [{"role": "system", "content": system[role]}] + [
            {"role": "assistant" if m.role == role else "user", "content": m.text} for m in messages]
        rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert views[role].ids == ids(tok, rendered)
        prompts[role].append(list(views[role].ids))
        stopped = turn != 2
        sampled = tuple(tok.convert_tokens_to_ids(list(rng.choice(WORDS, 2)))) + (tok.eos_token_id,) * stopped
        reply = Message(role, tok.decode(sampled, skip_special_tokens=True), sampled_ids=sampled,
                        logprobs=tuple(-rng.uniform(size=len(sampled))), stopped=stopped)
        views[role].add_reply(reply)
        messages.append(reply)
    for role, view in views.items():
        assert all(view.ids[:len(p)] == p for p in prompts[role])
        own = [m for m in messages if m.role == role and m.sampled_ids]
        assert sum(view.loss_mask) == sum(len(m.sampled_ids) for m in own)
        trained = [lp for lp, m in zip(view.logprobs, view.loss_mask) if m]
        assert trained == [lp for m in own for lp in m.logprobs]


@pytest.mark.parametrize("change", ["rewritten", "removed", "hidden"])
def test_a_history_that_changed_under_the_view_is_refused(tok, change):
    messages = [Message(SIM, "say apple")]
    view = RoleView()
    grow(tok, view, "s", messages, AGENT)
    reply = Message(AGENT, "apple", sampled_ids=tuple(ids(tok, "apple")), logprobs=(-1.0,))
    view.add_reply(reply)
    messages += [reply, Message(SIM, "yes")]
    view.next_prompt(tok, "s", messages, AGENT)  # unchanged: fine
    if change == "rewritten":
        messages[0] = Message(SIM, "say pear")
    elif change == "removed":
        del messages[0]
    else:
        messages[0] = Message(SIM, "say apple", visible_to=(SIM,))
    with pytest.raises(ViewError, match="the agent already saw changed"):
        view.next_prompt(tok, "s", messages, AGENT)
