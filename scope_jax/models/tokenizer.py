"""Tokenizer access: load a local tokenizer; thinking off by default; a chat template's own text; exact token
spans of messages."""

from __future__ import annotations

import bisect
import weakref

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# Stand-ins for message contents when rendering the template's own text: Unicode private-use
# characters, which no chat template writes or alters.
_MARKER = "\ue000{}\ue001"


def load_tokenizer(folder: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a local folder (tokenizer.json + tokenizer_config.json); never the network."""
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


def chat_token_spans(tokenizer: PreTrainedTokenizerBase, messages: list[dict], *,
                     add_generation_prompt: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a chat rendered by the tokenizer's chat template, and each message's content span.

    Guarantee: `ids` are exactly `tokenizer(text, add_special_tokens=False).input_ids` for the rendered
    `text` (what `apply_chat_template(tokenize=True)` returns), and for message i, `ids[s:e]` with
    `(s, e) = spans[i]` are exactly the tokens of its content: `tokenizer.decode(ids[s:e]) ==
    messages[i]["content"]`, no token crosses a content boundary, and every token outside the spans
    comes from the template alone. When that cannot hold, a ValueError says why instead.

    How: `template_pieces` gives the template's own text between contents without searching for the
    content (a content such as "user" also occurs in the template). The real rendering must be exactly
    those pieces with the contents inserted verbatim; the character spans are then mapped to tokens
    via the offsets.

    Raises:
      ValueError: the template does not insert a content verbatim (it strips or rewrites it), a
        message has no string content, or a content boundary falls inside a token (template and
        content merge into one token: SmolLM2's "user\\n" before a content "  x" gives a "\\n " token).
    """
    contents = [message.get("content") for message in messages]
    if not all(isinstance(content, str) for content in contents):
        raise ValueError("chat_token_spans needs a string 'content' in every message")
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    pieces = template_pieces(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    char_spans, rebuilt = [], pieces[0]
    for content, template_after in zip(contents, pieces[1:]):
        char_spans.append((len(rebuilt), len(rebuilt) + len(content)))
        rebuilt += content + template_after
    if rebuilt != text:
        raise ValueError("the chat template does not insert message contents verbatim (does it strip or "
                         "rewrite them?); pass contents exactly as the template renders them")

    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoding["input_ids"]), encoding["offset_mapping"]
    starts = [start for start, _ in offsets]
    spans = [(_token_boundary(starts, offsets, start), _token_boundary(starts, offsets, end))
             for start, end in char_spans]
    for (s, e), content in zip(spans, contents):
        if tokenizer.decode(ids[s:e], clean_up_tokenization_spaces=False) != content:
            raise ValueError(f"content {content[:40]!r} does not start and end on token boundaries")
    return ids, spans


def _token_boundary(starts: list[int], offsets: list[tuple[int, int]], char: int) -> int:
    """Index of the first token starting at or after `char`; ValueError if a token spans `char`."""
    index = bisect.bisect_left(starts, char)
    if index and offsets[index - 1][1] > char:
        start, end = offsets[index - 1]
        raise ValueError(f"a content boundary at character {char} falls inside token {index - 1} "
                         f"(characters {start}..{end}); its token span would not be exact")
    return index


# tokenizer -> {(template, add_generation_prompt, what each message shows besides its content): pieces}
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def template_pieces(tokenizer: PreTrainedTokenizerBase, messages: list[dict], *,
                    add_generation_prompt: bool = False) -> list[str]:
    """The chat template's own text around the message contents: len(messages) + 1 strings, so that
    pieces[0] + c0 + pieces[1] + c1 + ... + pieces[-1] is the rendering with contents c0, c1, ... inserted
    verbatim. Contents are never seen by the template (each is replaced by a unique marker), so the pieces
    do not depend on them, and they are cached by everything else: role views render the template once
    per own turn of every episode, and jinja rendering is most of their cost."""
    shape = tuple(repr(sorted((k, v) for k, v in m.items() if k != "content")) for m in messages)
    cache = _PIECES.setdefault(tokenizer, {})
    key = (tokenizer.chat_template, add_generation_prompt, shape)
    if key not in cache:
        cache[key] = tuple(_render_pieces(tokenizer, messages, add_generation_prompt))
    return list(cache[key])


def _render_pieces(tokenizer: PreTrainedTokenizerBase, messages: list[dict],
                   add_generation_prompt: bool) -> list[str]:
    markers = [_MARKER.format(i) for i in range(len(messages))]
    marked = tokenizer.apply_chat_template([dict(message, content=marker) for message, marker in
                                            zip(messages, markers)],
                                           tokenize=False, add_generation_prompt=add_generation_prompt)
    pieces, rest = [], marked
    for marker in markers:
        if rest.count(marker) != 1:
            raise ValueError("the chat template does not render each message content exactly once")
        before, rest = rest.split(marker)
        pieces.append(before)
    return pieces + [rest]
