"""Decoder configuration, read from (and written back to) Hugging Face `config.json` dictionaries."""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder-only LM (Llama / SmolLM2, Qwen2, Qwen3 families).

    Attributes:
      model_type: "llama", "qwen2" or "qwen3"; decides the HF class names written by save_pretrained.
      vocab_size, hidden_size, intermediate_size, num_layers: the usual sizes.
      num_heads, num_kv_heads, head_dim: grouped-query attention; head_dim may differ from hidden/heads.
      rms_norm_eps: epsilon of every RMSNorm.
      rope_theta: RoPE base; rope_scaling: None or the sorted items of an HF "llama3" scaling dict
        (items, so the config stays hashable and can be a static argument of jit).
      attention_bias: biases on q, k, v projections (Qwen2).
      qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3).
      tie_word_embeddings: the output projection is the transposed input embedding.
      max_position_embeddings: longest position the model was trained for (informational).
      bos_token_id, eos_token_id: kept so a saved folder round-trips.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        if self.model_type not in SUPPORTED:
            raise ValueError(f"model_type {self.model_type!r} is not supported (supported: {SUPPORTED})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.rope_scaling is not None and dict(self.rope_scaling).get("rope_type") != "llama3":
            raise ValueError(f"rope_scaling {dict(self.rope_scaling)} is not supported (only 'llama3')")

    @property
    def num_params(self) -> int:
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.attention_bias:
            attn += hd * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.num_layers * layer + self.vocab_size * d + d + head

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from an HF config.json dict (transformers 4.x `rope_theta/rope_scaling` or 5.x
        `rope_parameters` spellings)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED:
            raise ValueError(f"config.json has model_type {model_type!r}; supported: {', '.join(SUPPORTED)}")
        rope = dict(hf.get("rope_parameters") or {})
        scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
            scaling.setdefault("rope_type", scaling.get("type", "default"))
            scaling = None if scaling["rope_type"] == "default" else tuple(sorted(scaling.items()))
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=scaling,
            attention_bias=hf.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict that transformers loads into the matching *ForCausalLM class."""
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        hf = {
            "architectures": [arch[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else dict(self.rope_scaling),
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                             else self.eos_token_id),
        }
        if self.model_type != "qwen2":  # Qwen2 always has q/k/v biases; Llama and Qwen3 read the flag
            hf["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            hf["mlp_bias"] = False
        return hf
