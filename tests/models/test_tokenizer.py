"""Tokenizer loading and exact per-message token spans of chat renderings."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from scope_jax.models.tokenizer import chat_token_spans, load_tokenizer, template_pieces

TINY_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "user"},  # also the role name the template writes just before it
    {"role": "assistant", "content": "Ça va? 😀 1 2 3"},
    {"role": "user", "content": ""},
]


def tiny_tokenizer(chat_template: str = TINY_TEMPLATE) -> PreTrainedTokenizerFast:
    """Byte-level BPE without a pre-tokenizer split, so merges cross template/content boundaries: the
    ">h" merge joins the template's ">" with a content starting with "h"."""
    merges = [("Ġ", "Ġ"), (">", "h"), ("B", "e")]
    vocab = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(merge) for merge in merges]
    backend = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(vocab)}, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=chat_template)


def assert_exact_spans(tokenizer, messages: list[dict], add_generation_prompt: bool) -> None:
    """The documented guarantee: ids are the template's, each span decodes to its content, and the
    pieces between and inside the spans decode back to the whole rendering."""
    ids, spans = chat_token_spans(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    assert ids == tokenizer(text, add_special_tokens=False).input_ids
    assert len(spans) == len(messages)
    cuts = [0] + [cut for span in spans for cut in span] + [len(ids)]
    assert cuts == sorted(cuts)
    decode = lambda piece: tokenizer.decode(piece, clean_up_tokenization_spaces=False)
    for (s, e), message in zip(spans, messages):
        assert decode(ids[s:e]) == message["content"]
    assert "".join(decode(ids[a:b]) for a, b in zip(cuts[:-1], cuts[1:])) == text


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_tiny_spans_are_exact(add_generation_prompt):
    assert_exact_spans(tiny_tokenizer(), CHAT, add_generation_prompt)


def test_template_pieces_do_not_depend_on_contents():
    tokenizer = tiny_tokenizer()
    pieces = template_pieces(tokenizer, CHAT, add_generation_prompt=True)
    assert pieces == ["<system>", "\n<user>", "\n<assistant>", "\n<user>", "\n<assistant>"]
    other = [dict(message, content="xyz") for message in CHAT]
    assert template_pieces(tiny_tokenizer(), other, add_generation_prompt=True) == pieces  # not cached


def test_cached_pieces_follow_roles_flag_and_template():
    tokenizer = tiny_tokenizer()
    assert template_pieces(tokenizer, CHAT[:2]) == ["<system>", "\n<user>", "\n"]
    assert template_pieces(tokenizer, CHAT[:2], add_generation_prompt=True)[-1] == "\n<assistant>"
    swapped = [dict(CHAT[0], role="user"), dict(CHAT[1], role="assistant")]
    assert template_pieces(tokenizer, swapped) == ["<user>", "\n<assistant>", "\n"]
    tokenizer.chat_template = "[" + TINY_TEMPLATE
    assert template_pieces(tokenizer, CHAT[:2]) == ["[<system>", "\n<user>", "\n"]


def test_tiny_spans_values():
    tokenizer = tiny_tokenizer()
    ids, spans = chat_token_spans(tokenizer, [{"role": "u", "content": "Be"}, {"role": "a", "content": "x"}])
    assert tokenizer.convert_ids_to_tokens(ids) == ["<", "u", ">", "Be", "Ċ", "<", "a", ">", "x", "Ċ"]
    assert spans == [(3, 4), (8, 9)]


def test_boundary_inside_a_token_raises():
    with pytest.raises(ValueError, match="falls inside token 2"):
        chat_token_spans(tiny_tokenizer(), [{"role": "u", "content": "hello"}])  # "<u" then ">h" merged


def test_template_that_rewrites_content_raises():
    tokenizer = tiny_tokenizer(TINY_TEMPLATE.replace("m.content", "m.content | trim"))
    assert_exact_spans(tokenizer, [{"role": "u", "content": "no padding"}], False)
    with pytest.raises(ValueError, match="verbatim"):
        chat_token_spans(tokenizer, [{"role": "u", "content": " padded "}])


def test_content_must_be_a_string():
    with pytest.raises(ValueError, match="string 'content'"):
        chat_token_spans(tiny_tokenizer(), [{"role": "u", "content": [{"type": "text", "text": "hi"}]}])


def test_load_tokenizer_round_trip(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.chat_template == TINY_TEMPLATE
    assert chat_token_spans(loaded, CHAT) == chat_token_spans(tokenizer, CHAT)


# ---- the SmolLM2 tokenizer built from its GGUF file ----

SMOLLM2_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    CHAT[:3] + [{"role": "user", "content": "system"},
                {"role": "assistant", "content": "def f(x):\n    return x + 1\n\n# 2024 ✨"},
                {"role": "user", "content": "<|im_start|> inside content, and trailing spaces  "}],
]


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("chat", SMOLLM2_CHATS, ids=["one-turn", "multi-turn"])
def test_smollm2_spans_are_exact(smollm2_gguf, chat, add_generation_prompt):
    assert_exact_spans(smollm2_gguf[2], chat, add_generation_prompt)


@pytest.mark.slow
def test_smollm2_boundary_inside_a_token_raises(smollm2_gguf):
    """The template's "user\\n" and a content starting with two spaces pre-tokenize as "\\n " + " x"."""
    with pytest.raises(ValueError, match="falls inside token"):
        chat_token_spans(smollm2_gguf[2], [{"role": "user", "content": "  x"}])


@pytest.mark.slow
def test_smollm2_tokenizer_save_load_round_trip(smollm2_gguf, tmp_path):
    tokenizer = smollm2_gguf[2]
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    for chat in SMOLLM2_CHATS:
        assert chat_token_spans(loaded, chat) == chat_token_spans(tokenizer, chat)
    assert loaded.tokenize("x  1") == ["x", "ĠĠ", "1"]  # the digit split survives tokenizer.json
    for name in ("bos_token", "eos_token", "pad_token"):
        assert getattr(loaded, name) == getattr(tokenizer, name)
