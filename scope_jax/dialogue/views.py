"""Each role's token view of a dialogue.

A role sees the dialogue through its own tokenizer and chat template: its system prompt, its own
messages as "assistant" turns and everything else it may see as "user" turns (so the simulator sees the
roles flipped). The view is built piece by piece: the template's own text between message contents
is tokenised on its own, the other side's text is tokenised as text, and the role's own messages are
the exact ids it sampled. Nothing a model generated is ever re-tokenised.

The view grows turn by turn, as the role saw it: the template text up to each of its own messages comes
from the template rendered at that point with a generation prompt (the prompt it sampled from), and only
what follows its last message from the current rendering. So every prompt is a prefix of the later
views by construction (checked again when the batch is built), also with templates that render earlier
turns differently once later turns exist: Qwen3's drops the (empty) think block of the generation prompt
from past assistant turns, which a single rendering of the whole dialogue would silently rewrite.
"""

from __future__ import annotations

import dataclasses

from transformers import PreTrainedTokenizerBase

from scope_jax.dialogue.episode import Message
from scope_jax.models.tokenizer import template_pieces


@dataclasses.dataclass(frozen=True)
class RoleView:
    """ids [T]; loss_mask [T] (1 on tokens this role sampled); logprobs [T] (behaviour, 0 elsewhere)."""

    ids: tuple[int, ...]
    loss_mask: tuple[float, ...]
    logprobs: tuple[float, ...]


def chat_messages(system_prompt: str, messages: list[Message], me: str) -> list[dict[str, str]]:
    """The chat `me` sees: its system prompt, own turns as assistant, visible others as user."""
    chat = [{"role": "system", "content": system_prompt}]
    chat += [{"role": "assistant" if m.role == me else "user", "content": m.text}
             for m in messages if me in m.visible_to]
    return chat


def role_view(tokenizer: PreTrainedTokenizerBase, system_prompt: str, messages: list[Message], me: str, *,
              add_generation_prompt: bool) -> RoleView:
    """The token view of `me` ("agent" or "sim"); with `add_generation_prompt` it is the prompt of me's
    next turn."""
    chat = chat_messages(system_prompt, messages, me)
    shown = [m for m in messages if me in m.visible_to]
    contents: list[Message | str] = [system_prompt, *shown]  # chat[i]'s content, a Message for turns
    encode = lambda text: list(tokenizer(text, add_special_tokens=False).input_ids) if text else []
    ids, mask, logprobs = [], [], []
    pending_stop: tuple[int, float] | None = None  # the previous own message's sampled stop token

    def extend(new_ids: list[int], new_logprobs: list[float] | None = None) -> None:
        ids.extend(new_ids)
        mask.extend([float(new_logprobs is not None)] * len(new_ids))
        logprobs.extend(new_logprobs if new_logprobs is not None else [0.0] * len(new_ids))

    def add_template(text: str) -> None:
        nonlocal pending_stop
        template = encode(text)
        if pending_stop is not None:
            # The model ended its turn with this token, so it is the model's own whether or not the
            # template writes the same end-of-turn token; a template copy right after is not repeated.
            extend([pending_stop[0]], [pending_stop[1]])
            if template[:1] == [pending_stop[0]]:
                template = template[1:]
            pending_stop = None
        extend(template)

    def add_content(content: Message | str) -> None:
        nonlocal pending_stop
        if isinstance(content, Message) and content.role == me and content.sampled_ids is not None:
            sampled, lps = list(content.sampled_ids), list(content.logprobs)
            end = len(sampled) - 1 if content.stopped else len(sampled)
            extend(sampled[:end], lps[:end])
            pending_stop = (sampled[-1], lps[-1]) if content.stopped else None
        else:
            extend(encode(content.text if isinstance(content, Message) else content))

    # Segments end at each own message (rendered up to it, with the generation prompt it was sampled
    # after) and at the end of the chat (rendered as asked).
    ends = [i for i, content in enumerate(contents) if isinstance(content, Message) and content.role == me]
    start = 0  # the first chat message whose template text is not in the view yet
    for end in ends + [len(chat)]:
        pieces = template_pieces(tokenizer, chat[:end],
                                 add_generation_prompt=end < len(chat) or add_generation_prompt)
        for i in range(start, end):
            add_template(pieces[i])
            add_content(contents[i])
        add_template(pieces[end])
        if end < len(chat):
            add_content(contents[end])
        start = end + 1
    return RoleView(tuple(ids), tuple(mask), tuple(logprobs))
