"""Tokenizer access: load a local tokenizer; thinking off by default; a chat template's own text."""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # transformers (and torch behind it) loads only when a tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

# Stand-ins for message contents when rendering the template's own text: Unicode private-use
# characters, which no chat template writes or alters.
_MARKER = "\ue000{}\ue001"


def load_tokenizer(folder: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a local folder (tokenizer.json + tokenizer_config.json); never the network."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


# Prepended to a template that reads `enable_thinking` (Qwen3's): false unless the caller passes it.
# Jinja's `if` opens no scope, so the `set` holds for the whole template.
THINKING_OFF = "{%- if enable_thinking is not defined %}{%- set enable_thinking = false %}{%- endif %}"


def without_thinking(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer` (changed in place) with its chat template's thinking off by default.

    Qwen3's template lets the model open a `<think>` block after the generation prompt unless
    `apply_chat_template(..., enable_thinking=False)` is passed; its reasoning is plain text to the
    other role, and the template renders past turns without it. With the default set here the
    generation prompt closes an empty think block (`<think>\\n\\n</think>\\n\\n`) and the model answers
    directly; passing `enable_thinking=True` still turns thinking on. Templates that do not read
    `enable_thinking` are left as they are.
    """
    template = tokenizer.chat_template
    if isinstance(template, str) and "enable_thinking" in template and not template.startswith(THINKING_OFF):
        tokenizer.chat_template = THINKING_OFF + template
    return tokenizer


# tokenizer -> {(template, add_generation_prompt, what each message shows besides its content): pieces}
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def template_pieces(tokenizer: PreTrainedTokenizerBase, messages: list[dict], *,
                    add_generation_prompt: bool = False, tools: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The chat template's own text around the message contents: len(messages) + 1 strings, so that
    pieces[0] + c0 + pieces[1] + c1 + ... + pieces[-1] is the rendering with contents c0, c1, ... inserted
    verbatim. Contents are never seen by the template (each is replaced by a unique marker), so the pieces
    do not depend on them, and they are cached by everything else: role views render the template once
    per own turn of every episode, and jinja rendering is most of their cost. `tools`: function schemas
    passed to the template as `tools=` (templates with tool support list them in the system turn)."""
    shape = tuple(repr(sorted((k, v) for k, v in m.items() if k != "content")) for m in messages)
    cache = _PIECES.setdefault(tokenizer, {})
    key = (tokenizer.chat_template, add_generation_prompt, shape, json.dumps(list(tools), sort_keys=True))
    if key not in cache:
        cache[key] = tuple(_render_pieces(tokenizer, messages, add_generation_prompt, tools))
    return list(cache[key])


def _render_pieces(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool,
                   tools: Sequence[dict[str, Any]]) -> list[str]:
    markers = [_MARKER.format(i) for i in range(len(messages))]
    marked = tokenizer.apply_chat_template([dict(message, content=marker) for message, marker in
                                            zip(messages, markers)],
                                           tokenize=False, add_generation_prompt=add_generation_prompt,
                                           tools=list(tools) or None)
    pieces, rest = [], marked
    for marker in markers:
        if rest.count(marker) != 1:
            raise ValueError("the chat template does not render each message content exactly once")
        before, rest = rest.split(marker)
        pieces.append(before)
    return pieces + [rest]
