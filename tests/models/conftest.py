"""Tiny random HF models (Llama, Qwen2, Qwen3) saved as folders, built once per session."""

from __future__ import annotations

import pytest

# name -> (HF config class name, config kwargs beyond the shared tiny sizes)
TINY = {
    "llama": ("LlamaConfig", {}),
    "llama-tied-llama3": ("LlamaConfig", {
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }),
    "qwen2": ("Qwen2Config", {"rope_theta": 1e6}),
    "qwen3": ("Qwen3Config", {"head_dim": 24, "tie_word_embeddings": True}),  # head_dim != hidden / heads
}
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
             eos_token_id=2)


def build_tiny_hf(name: str, folder, dtype: str = "float32"):
    """A random tiny HF *ForCausalLM (eval mode) saved to `folder`; norms and biases are randomised too,
    so a mix-up between same-shaped tensors (q_norm / k_norm, biases) cannot go unnoticed."""
    import torch
    import transformers

    cls_name, extra = TINY[name]
    config = getattr(transformers, cls_name)(**SIZES, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.2 * noise if "norm" in param_name else 0.1 * noise)
    model.generation_config.eos_token_id = None  # greedy continuations run their full length
    model.generation_config.pad_token_id = 0
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    return model.float()


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """tiny_hf(name, dtype="float32") -> (folder, torch model); each one built once per session."""
    built = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in built:
            folder = tmp_path_factory.mktemp(f"{name}-{dtype}")
            built[name, dtype] = folder, build_tiny_hf(name, folder, dtype)
        return built[name, dtype]

    return get


@pytest.fixture(scope="session")
def smollm2_gguf():
    """`read_gguf` of the SmolLM2-135M-Instruct GGUF file: (HF config, state dict, tokenizer), read once."""
    from scope_jax.models.gguf import read_gguf
    from scope_jax.models.hf import smollm2_path

    return read_gguf(smollm2_path())
