"""GGUF reading: a tiny hand-written file (layout, permutation, config, tokenizer) and the real SmolLM2
file against transformers' own GGUF loading (tokenizer, every tensor, logits)."""

from __future__ import annotations

import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import pre_tokenizers

from scope_jax.models import ModelConfig, forward
from scope_jax.models.gguf import read_gguf, read_header
from scope_jax.models.hf import SMOLLM2_GGUF, params_from_state_dict, smollm2_path

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS = 2, 64, 96, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>"]
MERGES = ["Ġ Ġ", "h i", "Ġ 1"]
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
TOKENS = SPECIAL + USER_DEFINED + BYTES + [merge.replace(" ", "") for merge in MERGES]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's `LlamaModel.permute` (the reference the reader has to undo)."""
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_tiny_gguf(path, *, arch: str = "llama", tied: bool = True, pre: str = "smollm",
                    add_bos: bool = False) -> dict[str, np.ndarray]:
    """A 2-layer Llama GGUF as llama.cpp's converter writes it; returns the HF-layout weights it encodes
    (q_proj of layer 0 stored as Q8_0, so its expected value is the Q8_0 round trip)."""
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (len(TOKENS), HIDDEN)
    for i in range(LAYERS):
        prefix = f"model.layers.{i}."
        shapes |= {prefix + "input_layernorm.weight": (HIDDEN,),
                   prefix + "post_attention_layernorm.weight": (HIDDEN,),
                   prefix + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                   prefix + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   prefix + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   prefix + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                   prefix + "mlp.gate_proj.weight": (FFN, HIDDEN),
                   prefix + "mlp.up_proj.weight": (FFN, HIDDEN),
                   prefix + "mlp.down_proj.weight": (HIDDEN, FFN)}
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    gguf_names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}
    renames = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
    for i in range(LAYERS):
        gguf_names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{short}.weight"
                       for hf, short in renames.items()}

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.USER_DEFINED]
                           + [gguf.TokenType.NORMAL] * (len(TOKENS) - len(SPECIAL) - 1))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(TEMPLATE)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, value in weights.items():
        if "q_proj" in name or "k_proj" in name:
            value = llama_cpp_permute(value, HEADS if "q_proj" in name else KV_HEADS)
        if name == "model.layers.0.self_attn.q_proj.weight":
            writer.add_tensor(gguf_names[name], gguf.quants.quantize(value, q8), raw_dtype=q8)
            # Q8_0 quantises rows independently, so quantising commutes with the row permutation.
            weights[name] = gguf.quants.dequantize(gguf.quants.quantize(weights[name], q8), q8)
        else:
            writer.add_tensor(gguf_names[name], value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "lm_head"])
def tiny(request, tmp_path_factory):
    """(weights written, read_gguf result) for a tiny file with tied embeddings or an lm_head."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    weights = write_tiny_gguf(path, tied=request.param)
    return weights, read_gguf(str(path))


def test_tiny_state_dict_round_trips(tiny):
    """HF names and [out, in] layout, q/k un-permuted, Q8_0 de-quantised, lm_head only when written."""
    weights, (_, state_dict, _) = tiny
    assert state_dict.keys() == weights.keys()
    for name, value in weights.items():
        assert type(state_dict[name]) is np.ndarray and state_dict[name].flags.writeable  # not a file view
        assert state_dict[name].dtype == np.float32
        np.testing.assert_array_equal(state_dict[name], value, err_msg=name)


def test_tiny_config(tiny):
    weights, (config, _, _) = tiny
    expected = {
        "model_type": "llama", "vocab_size": len(TOKENS), "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "tie_word_embeddings": "lm_head.weight" not in weights, "bos_token_id": 1, "eos_token_id": 2}
    assert {key: config[key] for key in expected} == expected
    assert ModelConfig.from_hf(config).num_params == sum(w.size for w in weights.values())


def test_tiny_tokenizer(tiny):
    """Control tokens stay whole and special, user-defined ones whole; digits are split like llama.cpp's
    "smollm" pre-tokenizer (so the "Ġ1" merge never applies); the chat template comes along."""
    _, (_, _, tokenizer) = tiny
    ids = tokenizer("<|im_start|>hi  12<think> 1<|im_end|>").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["<|im_start|>", "hi", "ĠĠ", "1", "2", "<think>", "Ġ", "1",
                                                    "<|im_end|>"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi  12<think> 1"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n")


def test_gpt2_pre_tokenizer_and_bos(tmp_path):
    write_tiny_gguf(tmp_path / "gpt2.gguf", pre="gpt2", add_bos=True)
    _, _, tokenizer = read_gguf(str(tmp_path / "gpt2.gguf"))
    assert tokenizer.convert_ids_to_tokens(tokenizer("hi 1").input_ids) == ["<|im_start|>", "hi", "Ġ1"]


@pytest.mark.parametrize("kwargs, message", [({"arch": "qwen2"}, "architecture 'qwen2'"),
                                             ({"pre": "llama-bpe"}, "pre-tokenizer 'llama-bpe'")])
def test_unsupported_files_raise(tmp_path, kwargs, message):
    write_tiny_gguf(tmp_path / "other.gguf", **kwargs)
    with pytest.raises(ValueError, match=message):
        read_gguf(str(tmp_path / "other.gguf"))


# (writer method, field value) of every GGUF value type; a float32 field holds the value rounded to float32.
FIELDS = {"uint8": 250, "int8": -100, "uint16": 65000, "int16": -30000, "uint32": 4_000_000_000,
          "int32": -2_000_000_000, "float32": 0.1, "uint64": 2**63 + 5, "int64": -2**62, "float64": 0.1,
          "bool": True, "string": "héllo"}
ARRAYS = {"ints": [1, -2, 3], "floats": [0.5, 1.5], "strings": ["a", "", "ü b"], "nested": [[1, 2], [3]]}


def test_the_header_reader_gives_every_value_type_and_tensor_as_written(tmp_path):
    """Scalars, strings and (nested) arrays as written; each tensor's numpy shape and raw bytes, found
    past a custom 64-byte alignment of the tensor data."""
    rng = np.random.default_rng(0)
    types = gguf.GGMLQuantizationType
    quantized = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), types.Q4_1)
    tensors = {"f32": (rng.standard_normal((3, 5)).astype(np.float32), types.F32, (3, 5)),
               "f16": (rng.standard_normal((2, 4)).astype(np.float16), types.F16, (2, 4)),
               "q41": (quantized, types.Q4_1, (2, 64))}  # 2 rows of 64 values in 2 x 40 bytes
    writer = gguf.GGUFWriter(str(tmp_path / "all.gguf"), "llama")
    writer.add_custom_alignment(64)
    for kind, value in FIELDS.items():
        getattr(writer, f"add_{kind}")(f"t.{kind}", value)
    for name, value in ARRAYS.items():
        writer.add_array(f"t.{name}", value)
    for name, (value, tensor_type, _) in tensors.items():
        writer.add_tensor(name, value, raw_dtype=tensor_type if tensor_type == types.Q4_1 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    fields, read = read_header(str(tmp_path / "all.gguf"))
    expected = {f"t.{kind}": value for kind, value in (FIELDS | ARRAYS).items()}
    expected["t.float32"] = float(np.float32(0.1))
    assert fields == {"general.architecture": "llama", "general.alignment": 64} | expected
    assert [t.name for t in read] == list(tensors)
    for tensor, (value, tensor_type, shape) in zip(read, tensors.values()):
        assert (tensor.tensor_type, tensor.shape, tensor.data.dtype) == (tensor_type, shape, np.uint8)
        assert tensor.data.tobytes() == value.tobytes(), tensor.name


def test_a_broken_or_foreign_file_is_refused_in_one_line(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    whole = (tmp_path / "tiny.gguf").read_bytes()
    # the first tensor's entry in the table: its name, the number of dims (uint32), the dims (uint64 each),
    # then its type (uint32)
    dims_at = whole.index(b"token_embd.weight") + len(b"token_embd.weight")
    type_at = dims_at + 4 + 8 * int.from_bytes(whole[dims_at:dims_at + 4], "little")
    unknown_type = whole[:type_at] + (99).to_bytes(4, "little") + whole[type_at + 4:]
    not_utf8 = whole.replace(b"general.architecture", b"general.architectur\xff")
    cases = {"empty": (b"", "it is empty"), "zip": (b"PK\x03\x04" + whole[4:], "not a GGUF file"),
             "magic only": (whole[:2], "not a GGUF file"),
             "version 1": (b"GGUF\x01" + whole[5:], "version 1"),
             "in the counts": (whole[:12], "ends at byte 12"),
             "in the fields": (whole[:200], "ends at byte 200"),
             "in the last tensor": (whole[:-1], f"ends at byte {len(whole) - 1}"),
             "a name not UTF-8": (not_utf8, "not UTF-8"),
             "an unknown tensor type": (unknown_type, "'token_embd.weight' has unknown GGML type 99")}
    writer = gguf.GGUFWriter(str(tmp_path / "alignment 0.gguf"), "llama")
    writer.add_uint32("general.alignment", 0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    cases["alignment 0"] = ((tmp_path / "alignment 0.gguf").read_bytes(), "general.alignment is 0")
    for name, (content, message) in cases.items():
        (tmp_path / f"{name}.gguf").write_bytes(content)
        with pytest.raises(ValueError, match=message) as error:
            read_gguf(str(tmp_path / f"{name}.gguf"))
        assert str(tmp_path / f"{name}.gguf") in str(error.value) and "\n" not in str(error.value), name


@pytest.mark.slow
def test_smollm2_config(smollm2_gguf):
    config, state_dict, _ = smollm2_gguf
    c = ModelConfig.from_hf(config)
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
            c.tie_word_embeddings) == (30, 576, 9, 3, 64, 49152, True)
    assert c.num_params == sum(w.size for w in state_dict.values()) == 134_515_008


@pytest.mark.slow
def test_smollm2_digits_split_like_llama_cpp(smollm2_gguf):
    """tokenizer.ggml.pre = "smollm": llama.cpp isolates every digit before the gpt2 split, so a space
    run before a digit stays one pre-token. (transformers' GGUF converter does not know "smollm" and
    falls back to the gpt2 split: "x  1" -> x, Ġ, Ġ, 1 there.)"""
    _, _, tokenizer = smollm2_gguf
    assert tokenizer.tokenize("x  1") == ["x", "ĠĠ", "1"]
    assert tokenizer.tokenize("In 2024") == ["In", "Ġ", "2", "0", "2", "4"]


# ---- the real SmolLM2 file against transformers' own GGUF loading ----

TEXTS = [
    "Hello, world! How are you today?",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어",
    "Emojis 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 and ✨sparkles✨",
    "spaces   between\t\ttabs \n\n\nnewlines  \r\n trailing   ",
    "def f(x):\n    return x ** 2 + 1  # square\n\nprint([f(i) for i in range(10)])\n",
    "Numbers: 3.14159, 1,000,000 and 2024-06-01; x=42",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "It's, we'll, they're, I'd, don't",
    "",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello. 👋"}, {"role": "user", "content": "Count: 1 2 3"}],
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    pytest.importorskip("torch")  # transformers' GGUF tokenizer path imports it
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(smollm2_path()), gguf_file=SMOLLM2_GGUF)


@pytest.mark.slow
@pytest.mark.torch
def test_tokenizer_matches_transformers(smollm2_gguf, hf_tokenizer):
    _, _, tokenizer = smollm2_gguf
    assert len(tokenizer) == len(hf_tokenizer) == 49152
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert ids == hf_tokenizer(text).input_ids, text
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text
    assert tokenizer.all_special_ids == hf_tokenizer.all_special_ids


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_matches_transformers(smollm2_gguf, hf_tokenizer, add_generation_prompt):
    _, _, tokenizer = smollm2_gguf
    for chat in CHATS:
        text, hf_text = (tok.apply_chat_template(chat, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)
                         for tok in (tokenizer, hf_tokenizer))
        assert text == hf_text
        assert tokenizer(text).input_ids == hf_tokenizer(text).input_ids


@pytest.fixture(scope="module")
def hf_model():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.path.dirname(smollm2_path()), gguf_file=SMOLLM2_GGUF,
                                                dtype=torch.float32).eval()


@pytest.mark.slow
@pytest.mark.torch
def test_state_dict_matches_transformers(smollm2_gguf, hf_model):
    """Every de-quantised tensor equals transformers' (which un-permutes q/k with its own code)."""
    _, state_dict, _ = smollm2_gguf
    reference = {name: tensor.numpy() for name, tensor in hf_model.state_dict().items()}
    assert reference.keys() - state_dict.keys() == {"lm_head.weight"}  # tied: transformers lists it anyway
    np.testing.assert_array_equal(reference["lm_head.weight"], state_dict["model.embed_tokens.weight"])
    for name, value in state_dict.items():
        np.testing.assert_allclose(value, reference[name], atol=1e-6, rtol=0, err_msg=name)


@pytest.mark.slow
@pytest.mark.torch
def test_logits_match_transformers(smollm2_gguf, hf_model):
    import torch

    config, state_dict, tokenizer = smollm2_gguf
    graphdef, params = params_from_state_dict(ModelConfig.from_hf(config), state_dict, source="smollm2")
    tokens = np.asarray([tokenizer.apply_chat_template(CHATS[1], add_generation_prompt=True)["input_ids"]])
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    ours, _ = jax.jit(forward, static_argnums=0)(graphdef, params, jnp.asarray(tokens), positions)
    with torch.no_grad():
        reference = hf_model(torch.as_tensor(tokens)).logits.numpy()
    diff = float(np.abs(np.asarray(ours) - reference).max())
    scale = float(np.abs(reference).max())
    print(f"SmolLM2 logits over {tokens.shape[1]} tokens: max |ours - transformers| = {diff:.2e} "
          f"(max |logit| = {scale:.1f})")
    assert diff <= 1e-3 * max(1.0, scale)
    np.testing.assert_array_equal(np.asarray(ours).argmax(-1), reference.argmax(-1))
