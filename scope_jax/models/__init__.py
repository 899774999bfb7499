"""Decoder LMs in flax.nnx and their loading (see decoder.py for the architecture, hf.py for checkpoints)."""

from scope_jax.models.config import ModelConfig
from scope_jax.models.decoder import PARTITION_RULES, Decoder, KVCache, forward, init, split
from scope_jax.models.hf import CheckpointError, from_pretrained, save_pretrained

__all__ = ["ModelConfig", "Decoder", "KVCache", "PARTITION_RULES", "forward", "init", "split",
           "CheckpointError", "from_pretrained", "save_pretrained"]
