"""Read a llama.cpp GGUF file (Llama architecture) into an HF config, an HF state dict and a tokenizer.

Everything here is numpy + `tokenizers`; nothing imports torch. The file's header, metadata and tensor
table are read here (`read_header`): the `gguf` package's reader makes a numpy view of each string
of the vocabulary and merges, which is slow for a large vocabulary (docs/models.md). Quantised tensors are
de-quantised to float32 with the `gguf` package's own numpy code, so a Q4_1 file loads as the float32
weights it stands for (the quantisation error stays in the weights).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from typing import Any, NamedTuple

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

# GGUF tensor name -> HF parameter name of a LlamaForCausalLM ({i} is the layer index).
_LLAMA_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(.+)")

# `tokenizer.ggml.pre` -> how llama.cpp splits text before byte-level BPE. The gpt2 regex is the one
# `pre_tokenizers.ByteLevel(use_regex=True)` applies; the "smollm" family (llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_SMOLLM and its twins) first isolates every \p{N} character, exactly like the
# Digits(individual_digits=True) step of SmolLM's own tokenizer.json.
_GPT2_PRE = ("gpt2", "default")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact")


_VALUE = gguf.GGUFValueType
# The metadata value types that are scalars -> little-endian numpy dtypes (the others: STRING, ARRAY).
_SCALAR_DTYPES = {_VALUE.UINT8: "<u1", _VALUE.INT8: "<i1", _VALUE.UINT16: "<u2", _VALUE.INT16: "<i2",
                  _VALUE.UINT32: "<u4", _VALUE.INT32: "<i4", _VALUE.FLOAT32: "<f4", _VALUE.BOOL: "?",
                  _VALUE.UINT64: "<u8", _VALUE.INT64: "<i8", _VALUE.FLOAT64: "<f8"}


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (GGUF lists dims fastest-first)
    data: np.ndarray  # the tensor's raw bytes (uint8), a read-only view of the file


class _Cursor:
    """Reads little-endian GGUF values from `buffer` in order; a read past the end is a one-line error."""

    def __init__(self, buffer: mmap.mmap, path: str):
        self.buffer, self.offset, self.path = buffer, 0, path

    def _advance(self, size: int) -> int:
        start, self.offset = self.offset, self.offset + size
        if self.offset > len(self.buffer):
            raise ValueError(f"{self.path}: the GGUF file ends at byte {len(self.buffer)}, inside a value "
                             f"that needs bytes up to {self.offset} (truncated?)")
        return start

    def scalars(self, dtype: str, count: int) -> np.ndarray:
        return np.frombuffer(self.buffer, dtype, count, self._advance(np.dtype(dtype).itemsize * count))

    def uint(self, fmt: str) -> int:  # fmt: "I" (uint32) or "Q" (uint64)
        return struct.unpack_from("<" + fmt, self.buffer, self._advance(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        length = self.uint("Q")
        start = self._advance(length)
        try:
            return self.buffer[start:self.offset].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: the string at byte {start} is not UTF-8") from None

    def value(self, value_type: int) -> Any:
        """A metadata value as Python data: a scalar, a str, or a list of values."""
        if value_type == _VALUE.STRING:
            return self.string()
        if value_type == _VALUE.ARRAY:
            item_type, count = self.uint("I"), self.uint("Q")
            if item_type in _SCALAR_DTYPES:
                return self.scalars(_SCALAR_DTYPES[item_type], count).tolist()
            return [self.value(item_type) for _ in range(count)]
        if value_type not in _SCALAR_DTYPES:
            raise ValueError(f"{self.path}: unknown GGUF value type {value_type} at byte {self.offset - 4}")
        return self.scalars(_SCALAR_DTYPES[value_type], 1).tolist()[0]


def read_header(path: str) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """The metadata fields (name -> Python value) and the tensors (raw bytes as views of the file) of a
    little-endian GGUF file of version 2 or 3."""
    with open(path, "rb") as f:
        try:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # mmap refuses an empty file
            raise ValueError(f"{path}: not a GGUF file (it is empty)") from None
    cursor = _Cursor(buffer, path)
    if buffer[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (it starts with {bytes(buffer[:4])!r}, not b'GGUF')")
    cursor.offset = 4
    version = cursor.uint("I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3, little-endian)")
    tensor_count, field_count = cursor.uint("Q"), cursor.uint("Q")
    fields = {}
    for _ in range(field_count):
        name = cursor.string()
        fields[name] = cursor.value(cursor.uint("I"))
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.uint("Q") for _ in range(cursor.uint("I"))]
        table.append((name, dims, cursor.uint("I"), cursor.uint("Q")))
    alignment = fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"{path}: general.alignment is {alignment!r}, not a positive integer")
    data_start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, dims, type_id, offset in table:
        try:
            tensor_type = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise ValueError(f"{path}: tensor {name!r} has unknown GGML type {type_id}") from None
        block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
        cursor.offset = data_start + offset
        data = cursor.scalars("u1", math.prod(dims) // block_size * type_size)
        tensors.append(GGUFTensor(name, tensor_type, tuple(reversed(dims)), data))
    return fields, tensors


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray], PreTrainedTokenizerFast]:
    """Load a Llama-architecture GGUF file.

    Returns:
      config: an HF config.json dict (model_type "llama") for `ModelConfig.from_hf` / transformers.
      state_dict: HF parameter names -> float32 arrays in HF layout (`[out, in]` for projections);
        `lm_head.weight` only when the file has `output.weight` (otherwise `tie_word_embeddings`).
      tokenizer: the file's byte-level BPE tokenizer with its chat template and special tokens.

    Raises:
      ValueError: the architecture is not "llama", or the file uses a feature this reader does not
        translate (RoPE scaling, an unknown tensor, a tokenizer other than gpt2-style BPE).
    """
    fields, tensors = read_header(path)
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama')")
    state_dict = {_hf_name(t.name): _dequantize(t) for t in tensors}
    config = _config(fields, state_dict)
    for proj, heads in (("q_proj", config["num_attention_heads"]), ("k_proj", config["num_key_value_heads"])):
        for i in range(config["num_hidden_layers"]):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            state_dict[name] = _unpermute_rope_rows(state_dict[name], heads)
    return config, state_dict, _tokenizer(fields)


def _hf_name(gguf_name: str) -> str:
    match = _BLOCK_NAME.fullmatch(gguf_name)
    key, layer = (f"blk.{{i}}.{match[2]}", match[1]) if match else (gguf_name, None)
    if key not in _LLAMA_TENSORS:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama counterpart this reader knows")
    return _LLAMA_TENSORS[key].format(i=layer)


def _dequantize(tensor: GGUFTensor) -> np.ndarray:
    """Float32 values in HF layout (numpy order)."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    if not values.flags.writeable:  # unquantised tensors come back as read-only views of the file
        values = np.array(values)
    return values.astype(np.float32, copy=False).reshape(tensor.shape)


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of a q_proj / k_proj weight [heads * head_dim, in]."""
    # HF rotates the two halves of each head (rotate-half), llama.cpp rotates adjacent pairs. The
    # converter therefore reorders each head's rows from (2, head_dim/2) to (head_dim/2, 2), i.e.
    # interleaves the halves; reading them as (head_dim/2, 2) and swapping back restores HF's order.
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _float32_value(value: float) -> float:
    """The shortest decimal of a float32 metadata value (9.999999747378752e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _config(fields: dict[str, Any], state_dict: dict[str, np.ndarray]) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return fields.get(f"llama.{key}", default)

    if get("rope.scaling.type", "none") != "none":
        raise ValueError(f"RoPE scaling {get('rope.scaling.type')!r} in a GGUF file is not supported")
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    embed = state_dict["model.embed_tokens.weight"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": get("vocab_size", embed.shape[0]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", get("rope.dimension_count", hidden // heads)),
        "hidden_act": "silu",
        "rms_norm_eps": _float32_value(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_value(get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": get("context_length", 2048),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "lm_head.weight" not in state_dict,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
    }


def _tokenizer(fields: dict[str, Any]) -> PreTrainedTokenizerFast:
    """The gpt2-style byte-level BPE tokenizer a GGUF file describes in its `tokenizer.*` fields."""
    kind, pre = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2' byte-level BPE)")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2_PRE:
        pre_tokenizer = byte_level
    elif pre in _DIGITS_THEN_GPT2_PRE:
        pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(_GPT2_PRE + _DIGITS_THEN_GPT2_PRE)})")

    tokens = fields["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in fields["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    types = fields.get("tokenizer.ggml.token_type", [gguf.TokenType.NORMAL] * len(tokens))
    # Control tokens (<|im_start|>, ...) and user-defined ones are matched whole before BPE, like llama.cpp.
    tokenizer.add_tokens([AddedToken(token, special=token_type == gguf.TokenType.CONTROL, normalized=False)
                          for token, token_type in zip(tokens, types)
                          if token_type in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)])

    special_ids = {name: fields[f"tokenizer.ggml.{key}_token_id"]
                   for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"),
                                     ("unk_token", "unknown"))
                   if f"tokenizer.ggml.{key}_token_id" in fields}
    if fields.get("tokenizer.ggml.add_bos_token", False):
        bos = tokens[special_ids["bos_token"]]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, special_ids["bos_token"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer,
                                   chat_template=fields.get("tokenizer.chat_template"),
                                   **{name: tokens[i] for name, i in special_ids.items()})
