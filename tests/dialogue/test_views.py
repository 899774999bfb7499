import pytest

from scope_jax.dialogue.episode import AGENT, SIM, Message
from scope_jax.dialogue.views import role_view
from scope_jax.models.tiny import word_tokenizer

WORDS = ("say", "apple", "pear", "yes", "no", "ok")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS)


def ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_own_tokens_are_the_sampled_ids_and_only_they_are_trained(tok):
    end = tok.eos_token_id
    # The agent sampled "apple <unk>" then stopped: <unk> decodes to nothing, so the text is "apple" and a
    # re-tokenisation would lose a token. The view must keep the sampled ids.
    sampled = (tok.convert_tokens_to_ids("apple"), tok.unk_token_id, end)
    messages = [Message(SIM, "say apple"),
                Message(AGENT, "apple", sampled_ids=sampled, logprobs=(-1.0, -2.0, -0.5), stopped=True),
                Message(SIM, "ok")]
    view = role_view(tok, "be nice", messages, AGENT, add_generation_prompt=False)
    start, user, nl = tok.convert_tokens_to_ids(["<|im_start|>", "user", "assistant"])
    expected = ([start, tok.convert_tokens_to_ids("system")] + ids(tok, "be nice") + [end]
                + [start, user] + ids(tok, "say apple") + [end]
                + [start, nl] + list(sampled)
                + [start, user] + ids(tok, "ok") + [end])
    assert list(view.ids) == expected
    own = [i for i, m in enumerate(view.loss_mask) if m]
    first = expected.index(nl) + 1
    assert own == [first, first + 1, first + 2]  # content and the sampled stop token, nothing else
    assert [view.logprobs[i] for i in own] == [-1.0, -2.0, -0.5]
    assert sum(abs(lp) for i, lp in enumerate(view.logprobs) if i not in own) == 0


def test_simulator_sees_roles_flipped(tok):
    messages = [Message(SIM, "say pear", sampled_ids=tuple(ids(tok, "say pear")), logprobs=(-1.0, -1.0)),
                Message(AGENT, "pear")]
    view = role_view(tok, "ask", messages, SIM, add_generation_prompt=True)
    text = tok.decode(view.ids)
    assert text.index("assistant say pear") < text.index("user pear")
    assert text.endswith("assistant")  # the generation prompt of the simulator's next turn
    assert sum(view.loss_mask) == 2


def test_unstopped_turn_gets_template_end_untrained(tok):
    sampled = tuple(ids(tok, "yes yes"))
    messages = [Message(AGENT, "yes yes", sampled_ids=sampled, logprobs=(-1.0, -1.0), stopped=False)]
    view = role_view(tok, "s", messages, AGENT, add_generation_prompt=False)
    assert view.ids[-1] == tok.eos_token_id  # the template closes the turn ...
    assert view.loss_mask[-1] == 0.0  # ... but the model never sampled that token
    assert sum(view.loss_mask) == 2


def test_hidden_messages_are_not_in_the_other_view(tok):
    messages = [Message("env", "ok", visible_to=(AGENT,))]
    agent = role_view(tok, "s", messages, AGENT, add_generation_prompt=False)
    sim = role_view(tok, "s", messages, SIM, add_generation_prompt=False)
    assert tok.convert_tokens_to_ids("ok") in agent.ids and tok.convert_tokens_to_ids("ok") not in sim.ids


def test_each_generation_prompt_is_a_prefix_of_the_final_view(tok):
    sampled = tuple(ids(tok, "apple")) + (tok.eos_token_id,)
    history = [Message(SIM, "say apple")]
    prompt = role_view(tok, "s", history, AGENT, add_generation_prompt=True).ids
    history.append(Message(AGENT, "apple", sampled_ids=sampled, logprobs=(-1.0, -1.0), stopped=True))
    history.append(Message(SIM, "yes"))
    final = role_view(tok, "s", history, AGENT, add_generation_prompt=False).ids
    assert final[:len(prompt)] == prompt
    assert final[len(prompt):len(prompt) + 2] == sampled
