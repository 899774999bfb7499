"""Decoder LMs in flax.nnx and their loading (see decoder.py for the architecture)."""

from scope_jax.models.config import ModelConfig
from scope_jax.models.decoder import PARTITION_RULES, Decoder, KVCache, forward, init, split

__all__ = ["ModelConfig", "Decoder", "KVCache", "PARTITION_RULES", "forward", "init", "split"]
