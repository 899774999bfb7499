"""train_step: forward + backward of the masked mean token log-prob loss (`scope_jax.logprobs`), batch 8 x
256, tokens/s against PyTorch on the same weights, in float32 and in mixed precision (bfloat16 compute
from float32 master weights: ours a decoder with bfloat16 activations, PyTorch the same float32 model
under torch.autocast(bfloat16)); each side's loss difference from its float32 loss; achieved GFLOP/s
against this machine's float32 matmul peak, measured in the same alternating rounds. Headline: SmolLM2,
float32. Where the time goes: XLA op time by kind, from a profile of one step."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.bench.harness import (DTYPES, add_float32_drift, best_runs, compute_graphdef, matmul_fns,
                                       models, print_table, timed, token_batch, train_flops)
from experiments.bench.profiler import op_time_breakdown, print_breakdowns
from experiments.bench.references import torch_masked_nll, torch_model, torch_precision, torch_threads
from scope_jax.logprobs import token_logprobs

TABLE = (  # (label, key, format) of each column
    ("model", "model", "{:<13}"), ("dtype", "dtype", "{:<8}"), ("ours tok/s", "ours_tps", "{:>10.0f}"),
    ("torch tok/s", "torch_tps", "{:>11.0f}"), ("threads", "threads", "{:>7}"), ("ratio", "ratio", "{:>6.2f}"),
    ("ratio 1st", "ratio_first", "{:>9.2f}"), ("ours 1st s", "ours_first", "{:>10.2f}"),
    ("torch 1st s", "torch_first", "{:>11.2f}"),
    ("ours fwd s", "ours_fwd", "{:>10.2f}"), ("torch fwd s", "torch_fwd", "{:>11.2f}"),
    ("GFLOP/s", "gflops", "{:>7.1f}"), ("of f32 peak", "of_peak", "{:>11.0%}"),
    ("compile s", "compile_s", "{:>9.1f}"), ("ours loss", "ours_loss", "{:>10.6f}"),
    ("|ours-torch|", "loss_diff", "{:>12.1e}"), ("ours |d f32|", "ours_drift", "{:>12.1e}"),
    ("torch |d f32|", "torch_drift", "{:>13.1e}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                        help="compute dtypes (the weights are float32 in every column)")


def run(args: argparse.Namespace) -> float:
    import torch

    batch, length = 8, 256
    peak_flops, peak = matmul_fns()
    rows, breakdowns, headline = [], {}, float("nan")
    for name, model_config, graphdef, params in models(args.models):
        # position 0 has no prefix to be predicted from
        tokens_np, mask_np = token_batch(model_config, batch, length, skipped=1)
        tokens, mask = jnp.asarray(tokens_np, jnp.int32), jnp.asarray(mask_np)
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        reference = torch_model(model_config, params).train()
        torch_loss = torch_masked_nll(reference, tokens_np, mask_np)
        losses = {}
        for dtype in args.dtypes:
            ours_graphdef = compute_graphdef(model_config, dtype)

            def loss_fn(params):
                logprobs = token_logprobs(ours_graphdef, params, tokens, positions).logprobs
                return -jnp.sum(logprobs * mask) / jnp.sum(mask)

            grad_fn, forward_fn = jax.jit(jax.value_and_grad(loss_fn)), jax.jit(loss_fn)
            first, warm = timed(lambda: jax.block_until_ready(grad_fn(params)), 1)
            jax.block_until_ready(forward_fn(params))

            def theirs():
                reference.zero_grad(set_to_none=True)
                with torch_precision(dtype):
                    loss = torch_loss()
                loss.backward()
                return loss.detach()

            def theirs_forward():
                with torch.no_grad(), torch_precision(dtype):
                    return torch_loss()

            threads = torch_threads(theirs)
            after_other, best = best_runs({"ours": lambda: jax.block_until_ready(grad_fn(params)),
                                           "torch": theirs,
                                           "ours forward": lambda: jax.block_until_ready(forward_fn(params)),
                                           "torch forward": theirs_forward, "peak": peak["jax"]},
                                          args.repeats, in_a_row=2)
            losses[dtype] = float(grad_fn(params)[0]), float(theirs())
            breakdowns[name, dtype] = op_time_breakdown(grad_fn, params)
            gflops = train_flops(model_config, batch, length) / best["ours"] / 1e9
            ratio = best["torch"] / best["ours"]
            rows.append(dict(model=name, dtype=dtype, ours_tps=batch * length / best["ours"],
                             torch_tps=batch * length / best["torch"], threads=threads, ratio=ratio,
                             ratio_first=after_other["torch"] / after_other["ours"],
                             ours_first=after_other["ours"], torch_first=after_other["torch"],
                             ours_fwd=best["ours forward"], torch_fwd=best["torch forward"], gflops=gflops,
                             of_peak=gflops / (peak_flops / best["peak"] / 1e9),
                             compile_s=first - min(warm, best["ours"]), ours_loss=losses[dtype][0],
                             loss_diff=abs(losses[dtype][0] - losses[dtype][1])))
            print(f"  {name} {dtype}: ours {best['ours']:.2f}s, torch {best['torch']:.2f}s ({threads} threads), "
                  f"ratio {ratio:.2f}; float32 matmul peak {peak_flops / best['peak'] / 1e9:.0f} GFLOP/s",
                  flush=True)
            if name == "SmolLM2-135M" and dtype == "float32":
                headline = ratio
        add_float32_drift(rows, name, losses, ("ours_drift", "torch_drift"))
    print(f"\ntrain_step: value_and_grad of the masked mean token log-prob, batch {batch} x {length}, float32 "
          f"weights; {args.repeats} alternating rounds, in which each side runs twice in a row; ratio and "
          "GFLOP/s: the best second runs (after the same side's step, as in a training loop); 1st: the best "
          "first runs (after the other side's); GFLOP/s = (6 N T + 12 layers B L^2 heads head_dim) / time, "
          "against the float32 4096^3 jnp.dot timed in the same rounds; |d f32|: the loss's difference from the "
          "same side's float32 loss")
    print_table(rows, TABLE)
    print_breakdowns(breakdowns)
    return headline
