"""The PyTorch references: transformers (and peft) on the same float32 weights as ours."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments.bench.harness import best_of
from scope_jax.models import ModelConfig, save_pretrained


def torch_model(config: ModelConfig, params: Any):
    """The transformers *ForCausalLM with the same float32 weights (through `save_pretrained`)."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(params, config, None, folder)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")


def torch_threads(probe: Callable[[], Any], rounds: int = 2) -> int:
    """Set torch's intra-op threads to whichever of (all cores, 1) runs `probe` faster, and return it.

    On a machine shared with other processes, torch's OpenMP threads spin-wait for each other and one
    thread can be many times faster than all cores; the reference gets whichever is better right now. The
    counts alternate within each of `rounds` rounds (after one warm-up call), so a passing burst of load
    weighs on both alike.
    """
    import torch

    def at(threads: int) -> Callable[[], Any]:
        return lambda: (torch.set_num_threads(threads), probe())

    probe()
    seconds = best_of({threads: at(threads) for threads in dict.fromkeys((os.cpu_count(), 1))}, rounds)
    best = min(seconds, key=seconds.get)
    torch.set_num_threads(best)
    return best


def torch_masked_nll(model, tokens: np.ndarray, mask: np.ndarray) -> Callable[[], Any]:
    """A function giving the masked mean next-token NLL (a torch scalar) of `model` on `tokens` [B, L];
    mask [B, L] weighs token t (position 0, which has no prefix, is ignored)."""
    import torch

    input_ids, target_mask = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(mask)[:, 1:]

    def loss():
        logits = model(input_ids).logits[:, :-1]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
        return -(logprobs * target_mask).sum() / target_mask.sum()

    return loss


def torch_precision(dtype: str):
    """The context PyTorch computes `dtype` in: nothing for float32, autocast to bfloat16 on the CPU (its
    float32 weights are the master weights) for bfloat16."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
