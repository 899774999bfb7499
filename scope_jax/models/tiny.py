"""Tiny word-level models for tests and CPU experiments: a ChatML tokenizer over a small vocabulary and
small decoder configs. They run through exactly the same code as real LLMs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from scope_jax.models.config import ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<pad>", "<unk>", "<|im_start|>", "<|im_end|>")
TEMPLATE_WORDS = ("system", "user", "assistant")


def word_tokenizer(words: tuple[str, ...], chat_template: str = CHATML_TEMPLATE) -> PreTrainedTokenizerFast:
    """Whitespace-split word-level tokenizer over SPECIAL_TOKENS + TEMPLATE_WORDS + `words`, with a
    ChatML chat template (or `chat_template`, whose own words must be among `words`); <|im_end|> is the
    end-of-turn (eos) token and <pad> is id 0."""
    from transformers import PreTrainedTokenizerFast

    tokens = dict.fromkeys(SPECIAL_TOKENS + TEMPLATE_WORDS + tuple(words))
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"])
    fast.chat_template = chat_template
    return fast


def tiny_config(vocab_size: int, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2) -> ModelConfig:
    """A small Llama-type decoder for `vocab_size` tokens."""
    return ModelConfig(model_type="llama", vocab_size=vocab_size, hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=hidden_size // num_heads, tie_word_embeddings=True,
                       max_position_embeddings=4096)
