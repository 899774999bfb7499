"""Tool turns in role views, under Qwen3's real chat template (tests/fixtures/qwen3_chat_template.jinja) on a
word-level tokenizer: the tools in the system turn, tool results as the template's tool turns, prompts
that stay prefixes of the final view, and a loss mask on the role's own sampled tokens only."""

import json

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Message
from scope_jax.dialogue.views import RoleView, template_tools
from tests.dialogue.test_qwen3_template import THINK, qwen3_tokenizer, tokens

SCHEMA = {"type": "function", "function": {"name": "lookup", "description": "find an order",
                                           "parameters": {"type": "object", "properties": {}}}}
SCHEMA_WORDS = tuple(json.dumps(SCHEMA).split())
TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")
WORDS = THINK + TAGS + SCHEMA_WORDS + ("hello", "lookup", "one", "dollar", "no", "thanks", "how", "much")


def sampled(tok, text: str) -> Message:
    ids = tuple(tok.convert_tokens_to_ids(text.split())) + (tok.eos_token_id,)
    return Message(AGENT, text, sampled_ids=ids, logprobs=(-1.0,) * len(ids), stopped=True)


def agent_dialogue(tok) -> tuple[RoleView, list[Message], list[tuple[int, ...]]]:
    """The agent's view of: user; agent tool call (hidden from the user); two tool results; agent text;
    user; agent text. Returns the view, the messages and each prompt the agent sampled from."""
    messages, view, prompts = [Message(SIM, "hello")], RoleView(), []
    result = lambda text: Message(ENV, text, visible_to=(AGENT,), tool_result=True)
    script = [("<tool_call> lookup </tool_call>", [result("one dollar"), result("no")]),
              ("thanks", [Message(SIM, "how much")]), ("one dollar", [])]
    for text, after in script:
        view.add_prompt(view.next_prompt(tok, "help", messages, AGENT, tools=[SCHEMA]))
        prompts.append(tuple(view.ids))
        reply = sampled(tok, text)
        if text.startswith("<tool_call>"):
            reply.visible_to = (AGENT,)
        view.add_reply(reply)
        messages += [reply] + after
    return view, messages, prompts


def test_tool_turns_render_as_the_template_does_and_only_sampled_tokens_train():
    tok = qwen3_tokenizer(WORDS)
    view, messages, prompts = agent_dialogue(tok)
    for prompt in prompts:
        assert tuple(view.ids[:len(prompt)]) == prompt

    # Independent reference: HF's rendering of the finished chat with role "tool" and tools=. It differs
    # from the grown view only by the empty think blocks, which Qwen3 drops from all but the last turn.
    chat = [{"role": "system", "content": "help"}] + [
        {"role": "assistant" if m.role == AGENT else "tool" if m.role == ENV else "user", "content": m.text}
        for m in messages if AGENT in m.visible_to]
    whole = tok.apply_chat_template(chat, tools=[SCHEMA])["input_ids"]
    drop_think = lambda ids: [t for t in tokens(tok, ids) if t not in THINK]
    assert drop_think(view.ids) == drop_think(whole)

    # The tools sit in the system turn; the two results share one user turn, each in <tool_response>.
    shown = tokens(tok, view.ids)
    system = shown[:shown.index("<|im_end|>")]
    assert system[:2] == ["<|im_start|>", "system"] and "<tools>" in system
    start = system.index("<tools>") + 1
    assert system[start:start + len(SCHEMA_WORDS)] == list(SCHEMA_WORDS)
    after_call = tokens(tok, prompts[1][len(prompts[0]) + 4:])  # after "<tool_call> lookup </tool_call> eos"
    assert after_call == ["<|im_start|>", "user", "<tool_response>", "one", "dollar", "</tool_response>",
                          "<tool_response>", "no", "</tool_response>", "<|im_end|>", "<|im_start|>",
                          "assistant", *THINK]

    # Trained: exactly the sampled replies, the tool-call text included; never the tool results.
    own = [m for m in messages if m.role == AGENT]
    trained = [i for i, m in enumerate(view.loss_mask) if m]
    assert trained == [i for n, m in zip(view.prompt_lengths, own) for i in range(n, n + len(m.sampled_ids))]
    first_reply = tokens(tok, [view.ids[i] for i in trained[:4]])
    assert first_reply == ["<tool_call>", "lookup", "</tool_call>", "<|im_end|>"]


def test_no_tools_no_tool_listing_and_env_without_tools():
    tok = qwen3_tokenizer(WORDS)
    plain = RoleView().next_prompt(tok, "help", [Message(SIM, "hello")], AGENT)
    assert "<tools>" not in tokens(tok, plain.ids)

    class WithTools:
        def template_tools(self, role):
            return [SCHEMA] if role == AGENT else []

    assert template_tools(WithTools(), AGENT) == (SCHEMA,) and template_tools(WithTools(), SIM) == ()
    assert template_tools(object(), AGENT) == ()
