"""Each role's token view of a dialogue.

A role sees the dialogue through its own tokenizer and chat template: its system prompt, its own
messages as "assistant" turns and everything else it may see as "user" turns (so the simulator sees the
roles flipped). The view is built piece by piece: the template's own text between message contents
is tokenised on its own, the other side's text is tokenised as text, and the role's own messages are
the exact ids it sampled. Nothing a model generated is ever re-tokenised, and because the prompt of
every turn is built the same way, it is a prefix of the final view the role trains on (checked when
the batch is built).
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
    shown = [m for m in messages if me in m.visible_to]
    pieces = template_pieces(tokenizer, chat_messages(system_prompt, messages, me),
                             add_generation_prompt=add_generation_prompt)
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

    add_template(pieces[0])
    extend(encode(system_prompt))
    for message, template_before in zip(shown, pieces[1:-1]):
        add_template(template_before)
        if message.role == me and message.sampled_ids is not None:
            sampled, lps = list(message.sampled_ids), list(message.logprobs)
            content = len(sampled) - 1 if message.stopped else len(sampled)
            extend(sampled[:content], lps[:content])
            pending_stop = (sampled[-1], lps[-1]) if message.stopped else None
        else:
            extend(encode(message.text))
    add_template(pieces[-1])
    return RoleView(tuple(ids), tuple(mask), tuple(logprobs))
