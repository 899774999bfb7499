"""sft: one LoRA SFT step (forward + backward + AdamW update of the adapter, gradient clipping included) on
the masked next-token NLL, batch 8 x 256: ours (`scope_jax.training.sft_step` on a `scope_jax.models.lora`
base + adapter, jitted, state donated) against transformers + peft LoRA on the same float32 weights, the
same tokens and mask, rank, alpha and target projections (all seven), in tokens/s. Both adapters start
with B = 0, so both first losses are the base model's: their difference is printed. Headline: SmolLM2.
Without peft installed the reference column is nan (pip install peft)."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.harness import best_of, models, print_table
from experiments.bench.references import torch_masked_nll, torch_model, torch_threads
from scope_jax.models import ModelConfig


SFT_LORA = dict(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"))
SFT_TABLE = (  # (label, key, format) of each column of the sft table
    ("model", "model", "{:<13}"), ("ours tok/s", "ours_tokens_per_s", "{:>10.0f}"),
    ("peft tok/s", "peft_tokens_per_s", "{:>10.0f}"), ("torch threads", "threads", "{:>13}"),
    ("ratio", "ratio", "{:>6.2f}"), ("ours s", "ours_s", "{:>7.3f}"), ("peft s", "peft_s", "{:>7.3f}"),
    ("ours compile s", "compile_s", "{:>14.1f}"), ("ours adapter", "ours_adapter", "{:>12,}"),
    ("peft adapter", "peft_adapter", "{:>12}"), ("|first loss diff|", "loss_diff", "{:>17.1e}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags of its own."""


def ours_sft_step(graphdef, params, tokens: np.ndarray, mask: np.ndarray):
    """(run one step and return its loss, adapter parameter count) of our jitted LoRA SFT step; the step
    donates the state it carries (and with it `params`: build anything else from them first)."""
    from scope_jax.models import lora
    from scope_jax.training import state as joint
    from scope_jax.training.batch import TokenBatch
    from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
    from scope_jax.training.sft_step import SFTStepConfig, make_sft_step

    lora_graphdef, lora_params = lora.init(graphdef, params, lora.LoRAConfig(**SFT_LORA))
    optimizer = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-4), {"agent": True})
    carried = [joint.create({"agent": lora_params}, optimizer, seed=0)]
    step = jax.jit(make_sft_step(lora_graphdef, optimizer, SFTStepConfig(role="agent")), donate_argnums=0)
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    batch = TokenBatch(*map(jnp.asarray, (tokens.astype(np.int32), positions, mask)))

    def run() -> float:
        carried[0], metrics = step(carried[0], batch)
        return float(jax.block_until_ready((carried[0], metrics))[1]["loss"])

    return run, sum(x.size for x in jax.tree.leaves(lora_params.adapter))


def peft_sft_step(config: ModelConfig, params, tokens: np.ndarray, mask: np.ndarray):
    """(run one step and return its loss, adapter parameter count) of transformers + peft LoRA with the
    same weights, settings and loss (torch AdamW, gradient norm clipped to 1 as ours); None without peft."""
    import torch

    try:
        import peft
    except ImportError:
        print("peft is not installed (pip install peft): the reference column is nan")
        return None, float("nan")
    model = peft.get_peft_model(torch_model(config, params), peft.LoraConfig(
        r=SFT_LORA["rank"], lora_alpha=SFT_LORA["alpha"], target_modules=list(SFT_LORA["targets"]),
        lora_dropout=0.0, bias="none")).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    nll = torch_masked_nll(model, tokens, mask)

    def run() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = nll()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return float(loss.detach())

    return run, sum(p.numel() for p in trainable)


def run(args: argparse.Namespace) -> float:
    batch, length = 8, 256
    rows, headline = [], float("nan")
    for name, model_config, graphdef, params in models(args.models):
        tokens = np.random.RandomState(0).randint(1, model_config.vocab_size, (batch, length))
        mask = np.ones((batch, length), np.float32)
        mask[:, : length // 4] = 0.0  # a prompt the loss skips, as a role's view has
        theirs, peft_adapter = peft_sft_step(model_config, params, tokens, mask)
        ours, ours_adapter = ours_sft_step(graphdef, params, tokens, mask)  # donates params
        start = time.perf_counter()
        ours_first = ours()
        compile_s = time.perf_counter() - start
        fns = {"ours": ours}
        threads, loss_diff = "-", float("nan")
        if theirs is not None:
            loss_diff = abs(theirs() - ours_first)
            threads = torch_threads(theirs)
            fns["peft"] = theirs
        best = {"peft": float("nan"), **best_of(fns, args.repeats)}
        ratio = best["peft"] / best["ours"]
        rows.append(dict(model=name, ours_tokens_per_s=batch * length / best["ours"],
                         peft_tokens_per_s=batch * length / best["peft"], threads=threads, ratio=ratio,
                         ours_s=best["ours"], peft_s=best["peft"], compile_s=compile_s - best["ours"],
                         ours_adapter=ours_adapter, peft_adapter=f"{peft_adapter:,}", loss_diff=loss_diff))
        print(f"  {name}: ours {best['ours']:.3f}s, peft {best['peft']:.3f}s, ratio {ratio:.2f}", flush=True)
        if name == "SmolLM2-135M":
            headline = ratio
    print(f"\nsft: one LoRA SFT step (forward + backward + AdamW), rank {SFT_LORA['rank']}, alpha "
          f"{SFT_LORA['alpha']:g}, targets {'/'.join(SFT_LORA['targets'])}, batch {batch} x {length} "
          f"(loss on the last 3/4 of each row), best of {args.repeats} alternating runs; "
          "ratio = peft s / ours s")
    print_table(rows, SFT_TABLE)
    return headline
