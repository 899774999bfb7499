"""Tokenizer loading and a chat template's own text (template pieces)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from scope_jax.models.tokenizer import load_tokenizer, template_pieces

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


def test_load_tokenizer_round_trip(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.chat_template == TINY_TEMPLATE
    assert loaded.apply_chat_template(CHAT) == tokenizer.apply_chat_template(CHAT)


# ---- the SmolLM2 tokenizer built from its GGUF file ----

SMOLLM2_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    CHAT[:3] + [{"role": "user", "content": "system"},
                {"role": "assistant", "content": "def f(x):\n    return x + 1\n\n# 2024 ✨"},
                {"role": "user", "content": "<|im_start|> inside content, and trailing spaces  "}],
]


@pytest.mark.slow
def test_smollm2_tokenizer_save_load_round_trip(smollm2_gguf, tmp_path):
    tokenizer = smollm2_gguf[2]
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    for chat in SMOLLM2_CHATS:
        assert loaded.apply_chat_template(chat) == tokenizer.apply_chat_template(chat)
    assert loaded.tokenize("x  1") == ["x", "ĠĠ", "1"]  # the digit split survives tokenizer.json
    for name in ("bos_token", "eos_token", "pad_token"):
        assert getattr(loaded, name) == getattr(tokenizer, name)
