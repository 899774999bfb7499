"""Each role's token view of a dialogue, grown turn by turn.

A role sees the dialogue through its own tokenizer and chat template: its system prompt, its own
messages as "assistant" turns, the results of its tool calls (`Message.tool_result`) as "tool" turns, and
everything else it may see as "user" turns (so the simulator sees the roles flipped). An environment
with tools for a role names them (`template_tools`), and the template renders them in the system turn
(Qwen3's does; a template without tool support ignores them, and the environment then describes the
tools in the system prompt's text instead). The view is built piece by piece: the template's own text
between message contents is tokenised on its own, the other side's text is tokenised as text, and the
role's own sampled messages are the exact ids it sampled. Nothing a model generated is ever re-tokenised.

A `RoleView` only ever grows. Before each of the role's turns it is extended by the tokens that make it
that turn's prompt (`next_prompt`: the template text and messages since the role's last reply, and the
generation prompt, all from the template rendered now), and after the turn by the reply's sampled ids.
So every prompt the role sampled from is a prefix of its final view by construction, also with templates
that render earlier turns differently once later turns exist (Qwen3's drops the empty think block of
the generation prompt from past assistant turns, which one rendering of the finished dialogue would
silently rewrite). The final view is what the role trains on; it ends with the role's last reply.

The view assumes that what the role has seen stays as it was. `next_prompt` checks that the role's
chat still begins with the entries the view holds and raises `ViewError` otherwise (an environment
rewrote, removed or hid an earlier message).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from scope_jax.dialogue.episode import Message
from scope_jax.models.tokenizer import template_pieces

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ViewError(RuntimeError):
    """The dialogue a role already saw changed under its view."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """Tokens to append to a view: ids, loss mask (1 on the role's own sampled tokens), behaviour
    log-probs (0 elsewhere), and the role's chat they bring the view up to."""

    ids: tuple[int, ...]
    loss_mask: tuple[float, ...]
    logprobs: tuple[float, ...]
    chat: tuple[tuple[str, str], ...]


def chat_entries(system_prompt: str, messages: list[Message], me: str) -> list[tuple[str, Message | str]]:
    """The chat `me` sees, as (template role, content): its system prompt, own turns as assistant, tool
    results as tool, visible others as user. A content is the Message itself, or the system prompt's text."""
    return [("system", system_prompt)] + [(_template_role(m, me), m) for m in messages if me in m.visible_to]


def _template_role(message: Message, me: str) -> str:
    if message.role == me:
        return "assistant"
    return "tool" if message.tool_result else "user"


def template_tools(env: Any, role: str) -> tuple[dict[str, Any], ...]:
    """The function schemas `env` gives `role`'s chat template (its optional `template_tools(role)`)."""
    tools = getattr(env, "template_tools", None)
    return tuple(tools(role)) if tools is not None else ()


def _text(content: Message | str) -> str:
    return content.text if isinstance(content, Message) else content


@dataclasses.dataclass
class RoleView:
    """One role's token view of one episode: ids, loss_mask (1 on tokens the role sampled) and logprobs
    (the sampler's behaviour log-probs, 0 elsewhere), each [T] and growing.

    prompt_lengths: len(ids) at each prompt the role generated from, in order; the tokens appended since
    the last of them (its reply, then the next prompt's tail) are what the role has not processed yet.
    """

    ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[float] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_lengths: list[int] = dataclasses.field(default_factory=list)
    chat: tuple[tuple[str, str], ...] = ()  # the (template role, text) entries the view holds
    stop_token: int | None = None  # the view ends with the role's own stop token (not written twice)

    def __len__(self) -> int:
        return len(self.ids)

    def next_prompt(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, messages: list[Message],
                    me: str, tools: Sequence[dict[str, Any]] = ()) -> Segment:
        """The tokens that make this view the prompt of `me`'s next turn; the view itself is unchanged.
        `tools`: the function schemas passed to the template (the same at every turn of an episode)."""
        entries = chat_entries(system_prompt, messages, me)
        chat = tuple((role, _text(content)) for role, content in entries)
        if chat[:len(self.chat)] != self.chat:
            raise ViewError(f"the dialogue the {me} already saw changed (an earlier message was rewritten, "
                            "removed or hidden), so its token view no longer holds")
        pieces = template_pieces(tokenizer, [{"role": r, "content": t} for r, t in chat],
                                 add_generation_prompt=True, tools=tools)
        encode = lambda text: list(tokenizer(text, add_special_tokens=False).input_ids) if text else []
        ids, mask, logprobs = [], [], []
        stop = self.stop_token

        def extend(new_ids, new_logprobs=None) -> None:
            ids.extend(new_ids)
            mask.extend([float(new_logprobs is not None)] * len(new_ids))
            logprobs.extend(new_logprobs if new_logprobs is not None else [0.0] * len(new_ids))

        for i in range(len(self.chat), len(chat) + 1):
            template = encode(pieces[i])
            if stop is not None and template[:1] == [stop]:
                template = template[1:]  # the model's own stop token ended its turn already
            extend(template)
            stop = None
            if i < len(chat):
                content = entries[i][1]
                if isinstance(content, Message) and content.role == me and content.sampled_ids is not None:
                    sampled, stop = _own(content)
                    extend(*sampled)
                else:
                    extend(encode(chat[i][1]))
        return Segment(tuple(ids), tuple(mask), tuple(logprobs), chat)

    def add_prompt(self, segment: Segment) -> None:
        """Append a `next_prompt` segment: the view is now the prompt the role generates from."""
        self._extend(segment.ids, segment.loss_mask, segment.logprobs)
        self.chat, self.stop_token = segment.chat, None
        self.prompt_lengths.append(len(self.ids))

    def add_reply(self, message: Message) -> None:
        """Append the role's reply to the prompt just added: its sampled ids, trained, with their
        log-probs."""
        if message.sampled_ids is None:
            raise ValueError("a view grows by sampled replies only (a text reply is part of the next prompt)")
        (ids, logprobs), self.stop_token = _own(message)
        self._extend(ids, [1.0] * len(ids), logprobs)
        self.chat += (("assistant", message.text),)

    def _extend(self, ids, mask, logprobs) -> None:
        self.ids.extend(ids)
        self.loss_mask.extend(mask)
        self.logprobs.extend(logprobs)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, system_prompt: str, messages: list[Message],
               me: str, tools: Sequence[dict[str, Any]] = ()) -> tuple[int, ...]:
    """The prompt of `me`'s next turn rendered afresh (for prompts that no view keeps: probes, a system
    prompt other than the role's own)."""
    return RoleView().next_prompt(tokenizer, system_prompt, messages, me, tools).ids


def _own(message: Message) -> tuple[tuple[list[int], list[float]], int | None]:
    """(ids, log-probs) of a sampled own message, stop token included, and that stop token (or None)."""
    return (list(message.sampled_ids), list(message.logprobs)), (message.sampled_ids[-1] if message.stopped
                                                                 else None)
