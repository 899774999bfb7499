"""train_step: forward + backward of the masked mean token log-prob loss (`scope_jax.logprobs`), batch 8 x
256, tokens/s against PyTorch on the same weights, and achieved GFLOP/s against this machine's float32
matmul peak measured in the same run. Headline: SmolLM2. Where the time goes: XLA op time by kind, from a
profile of one step."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.harness import best_of, matmul_peak, models, timed, train_flops
from experiments.bench.profiler import op_time_breakdown
from experiments.bench.references import torch_masked_nll, torch_model, torch_threads
from scope_jax.logprobs import token_logprobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags of its own."""


def run(args: argparse.Namespace) -> float:
    import torch

    batch, length = 8, 256
    jax_peak, numpy_peak = matmul_peak()
    print(f"float32 matmul peak, 4096^3: jax {jax_peak:.0f} GFLOP/s, numpy {numpy_peak:.0f} GFLOP/s",
          flush=True)
    rows, breakdowns, headline = [], {}, float("nan")
    for name, model_config, graphdef, params in models(args.models):
        tokens_np = np.random.RandomState(0).randint(1, model_config.vocab_size, (batch, length))
        mask_np = np.ones((batch, length), np.float32)
        mask_np[:, 0] = 0.0  # position 0 has no prefix to be predicted from
        tokens, mask = jnp.asarray(tokens_np, jnp.int32), jnp.asarray(mask_np)
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))

        def loss_fn(params):
            logprobs = token_logprobs(graphdef, params, tokens, positions).logprobs
            return -jnp.sum(logprobs * mask) / jnp.sum(mask)

        grad_fn, forward_fn = jax.jit(jax.value_and_grad(loss_fn)), jax.jit(loss_fn)
        first, warm = timed(lambda: jax.block_until_ready(grad_fn(params)), 1)
        jax.block_until_ready(forward_fn(params))

        reference = torch_model(model_config, params).train()
        torch_loss = torch_masked_nll(reference, tokens_np, mask_np)

        def theirs():
            reference.zero_grad(set_to_none=True)
            loss = torch_loss()
            loss.backward()
            return loss.detach()

        def theirs_forward():
            with torch.no_grad():
                return torch_loss()

        threads = torch_threads(theirs)
        best = best_of({"ours": lambda: jax.block_until_ready(grad_fn(params)), "torch": theirs,
                        "ours forward": lambda: jax.block_until_ready(forward_fn(params)),
                        "torch forward": theirs_forward}, args.repeats)
        loss_diff = abs(float(grad_fn(params)[0]) - float(theirs()))
        breakdowns[name] = op_time_breakdown(grad_fn, params)
        flops = train_flops(model_config, batch, length)
        ratio = best["torch"] / best["ours"]
        rows.append((name, best, threads, flops / best["ours"] / 1e9, first - min(warm, best["ours"]), ratio,
                     loss_diff))
        print(f"  {name}: ours {best['ours']:.2f}s, torch {best['torch']:.2f}s ({threads} threads), "
              f"ratio {ratio:.2f}", flush=True)
        if name == "SmolLM2-135M":
            headline = ratio
    tokens_per_step = batch * length
    print(f"\ntrain_step: value_and_grad of the masked mean token log-prob, batch {batch} x {length}, "
          f"best of {args.repeats} alternating runs; "
          "GFLOP/s = (6 N T + 12 layers B L^2 heads head_dim) / time")
    print(f"{'model':<14}{'ours tok/s':>11}{'torch tok/s':>12}{'threads':>8}{'ratio':>7}{'ours fwd s':>11}"
          f"{'torch fwd s':>12}{'GFLOP/s':>9}{'of peak':>8}{'compile s':>10}{'|loss diff|':>12}")
    for name, best, threads, gflops, compile_s, ratio, loss_diff in rows:
        print(f"{name:<14}{tokens_per_step / best['ours']:>11.0f}{tokens_per_step / best['torch']:>12.0f}"
              f"{threads:>8}{ratio:>7.2f}{best['ours forward']:>11.2f}{best['torch forward']:>12.2f}"
              f"{gflops:>9.1f}{gflops / jax_peak:>8.0%}{compile_s:>10.1f}{loss_diff:>12.1e}")
    print("\nwhere our step's time goes (XLA op time of one profiled step, summed over threads):")
    for name, seconds in breakdowns.items():
        total = sum(seconds.values())
        parts = ", ".join(f"{phase} {kind} {s:.2f}s ({s / total:.0%})"
                          for (phase, kind), s in sorted(seconds.items(), key=lambda item: -item[1]))
        print(f"  {name}: {parts}")
    return headline
