"""sft: one LoRA SFT step (forward + backward + AdamW update of the adapter, gradient clipping included) on
the masked next-token NLL, batch 8 x 256: ours (`scope_jax.training.sft_step` on a `scope_jax.models.lora`
base + adapter, jitted, state donated) against transformers + peft LoRA on the same float32 weights, the
same tokens and mask, rank, alpha and target projections (all seven), in tokens/s, in float32 and in
mixed precision (bfloat16 compute, float32 weights; peft under torch.autocast(bfloat16)). Both adapters
start with B = 0, so both first losses are the base model's: their difference is printed, and each side's
difference from its float32 first loss. Achieved GFLOP/s against this machine's float32 matmul peak,
measured in the same alternating rounds, and where our step's time goes (XLA op time by kind). Headline:
SmolLM2, float32. Without peft installed the reference column is nan (pip install peft)."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.harness import (DTYPES, add_float32_drift, best_runs, compute_graphdef, matmul_fns,
                                       models, print_table, token_batch, train_flops)
from experiments.bench.profiler import op_time_breakdown, print_breakdowns
from experiments.bench.references import torch_masked_nll, torch_model, torch_precision, torch_threads
from scope_jax.models import ModelConfig


SFT_LORA = dict(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"))
SFT_TABLE = (  # (label, key, format) of each column of the sft table
    ("model", "model", "{:<13}"), ("dtype", "dtype", "{:<8}"), ("ours tok/s", "ours_tokens_per_s", "{:>10.0f}"),
    ("peft tok/s", "peft_tokens_per_s", "{:>10.0f}"), ("torch threads", "threads", "{:>13}"),
    ("ratio", "ratio", "{:>6.2f}"), ("ours s", "ours_s", "{:>7.3f}"), ("peft s", "peft_s", "{:>7.3f}"),
    ("ratio 1st", "ratio_first", "{:>9.2f}"), ("ours 1st s", "ours_first_s", "{:>10.3f}"),
    ("peft 1st s", "peft_first_s", "{:>10.3f}"),
    ("GFLOP/s", "gflops", "{:>7.1f}"), ("of f32 peak", "of_peak", "{:>11.0%}"),
    ("ours compile s", "compile_s", "{:>14.1f}"), ("ours adapter", "ours_adapter", "{:>12,}"),
    ("peft adapter", "peft_adapter", "{:>12}"), ("|first loss diff|", "loss_diff", "{:>17.1e}"),
    ("ours |d f32|", "ours_drift", "{:>12.1e}"), ("peft |d f32|", "peft_drift", "{:>12.1e}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                        help="compute dtypes (the base weights and the adapter are float32 in every column)")


def ours_sft_step(graphdef, params, tokens: np.ndarray, mask: np.ndarray):
    """(run one step and return its loss, profile the step's XLA ops, adapter parameter count) of our
    jitted LoRA SFT step. The step donates the state it carries, `params` included (pass a copy); the
    profile's step is its last (its new state is dropped)."""
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

    count = sum(x.size for x in jax.tree.leaves(lora_params.adapter))
    return run, lambda: op_time_breakdown(step, carried.pop(), batch), count


def peft_sft_step(config: ModelConfig, params, tokens: np.ndarray, mask: np.ndarray, dtype: str):
    """(run one step and return its loss, adapter parameter count) of transformers + peft LoRA with the
    same weights, settings and loss (torch AdamW, gradient norm clipped to 1 as ours), its forward in
    `torch_precision(dtype)`; None without peft."""
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
        with torch_precision(dtype):
            loss = nll()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return float(loss.detach())

    return run, sum(p.numel() for p in trainable)


def run(args: argparse.Namespace) -> float:
    batch, length = 8, 256
    peak_flops, peak = matmul_fns()
    rows, breakdowns, headline = [], {}, float("nan")
    for name, model_config, graphdef, params in models(args.models):
        # a prompt the loss skips, as a role's view has
        tokens, mask = token_batch(model_config, batch, length, skipped=length // 4)
        first_losses = {}
        for dtype in args.dtypes:
            theirs, peft_adapter = peft_sft_step(model_config, params, tokens, mask, dtype)
            ours, profile, ours_adapter = ours_sft_step(compute_graphdef(model_config, dtype),
                                                        jax.tree.map(jnp.copy, params), tokens, mask)
            start = time.perf_counter()
            ours_first = ours()
            compile_s = time.perf_counter() - start
            fns = {"ours": ours, "peak": peak["jax"]}
            threads, peft_first = "-", float("nan")
            if theirs is not None:
                peft_first = theirs()
                threads = torch_threads(theirs)
                fns["peft"] = theirs
            after_other, best = ({"peft": float("nan"), **runs}
                                 for runs in best_runs(fns, args.repeats, in_a_row=2))
            breakdowns[name, dtype] = profile()
            first_losses[dtype] = ours_first, peft_first
            ratio = best["peft"] / best["ours"]
            gflops = train_flops(model_config, batch, length, weight_gradients=False) / best["ours"] / 1e9
            rows.append(dict(model=name, dtype=dtype, ours_tokens_per_s=batch * length / best["ours"],
                             peft_tokens_per_s=batch * length / best["peft"], threads=threads, ratio=ratio,
                             ours_s=best["ours"], peft_s=best["peft"],
                             ratio_first=after_other["peft"] / after_other["ours"],
                             ours_first_s=after_other["ours"], peft_first_s=after_other["peft"], gflops=gflops,
                             of_peak=gflops / (peak_flops / best["peak"] / 1e9),
                             compile_s=compile_s - best["ours"], ours_adapter=ours_adapter,
                             peft_adapter=f"{peft_adapter:,}", loss_diff=abs(peft_first - ours_first)))
            print(f"  {name} {dtype}: ours {best['ours']:.3f}s, peft {best['peft']:.3f}s, ratio {ratio:.2f}; "
                  f"float32 matmul peak {peak_flops / best['peak'] / 1e9:.0f} GFLOP/s", flush=True)
            if name == "SmolLM2-135M" and dtype == "float32":
                headline = ratio
        add_float32_drift(rows, name, first_losses, ("ours_drift", "peft_drift"))
    print(f"\nsft: one LoRA SFT step (forward + backward + AdamW), rank {SFT_LORA['rank']}, alpha "
          f"{SFT_LORA['alpha']:g}, targets {'/'.join(SFT_LORA['targets'])}, batch {batch} x {length} "
          f"(loss on the last 3/4 of each row), float32 weights; {args.repeats} alternating rounds, "
          "in which each side runs twice in a row; ours s, peft s: the best second run (after the same "
          "side's step, as in a training loop); 1st s: the best first run (after the other side's); "
          "ratio = peft s / ours s; GFLOP/s = (4 N T + 12 layers B L^2 heads head_dim) / time (the forward "
          "and the activation gradients: a frozen base has no weight gradient), against the float32 "
          "4096^3 jnp.dot timed in the same rounds; |d f32|: the first loss's difference from the same "
          "side's float32 first loss")
    print_table(rows, SFT_TABLE)
    print_breakdowns(breakdowns)
    return headline
