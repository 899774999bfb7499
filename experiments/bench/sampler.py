"""sampler: generated tokens/s of `scope_jax.sampling.generate` (greedy, prompt 64, 64 new tokens, no early
stop) against transformers `generate` in PyTorch on the same float32 weights. By default SmolLM2-135M at
batch 16, the headline (a few minutes on a quiet 2-core CPU); `--models 5m smollm2 --batches 16 64` adds
a ~5M-parameter random Llama and batch 64 (past 15 minutes here).

Where the time goes: prefill vs per-token decode, against the time to read every weight once (what a
decode step costs at least when it is memory-bound), a decode step's XLA op time by kind (layer matmuls,
output head, attention, cache writes, sampling, copies), and the step's matmuls alone, in XLA and in
torch (what thin matmuls cost each of them)."""

from __future__ import annotations

import argparse
import collections
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.harness import best_of, models, timed, train_flops
from experiments.bench.profiler import op_seconds
from experiments.bench.references import torch_model, torch_threads
from scope_jax import sampling
from scope_jax.models import ModelConfig
from scope_jax.sampling import SamplingConfig, generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", nargs="+", type=int, default=[16], help="batch sizes")
    parser.set_defaults(models=["smollm2"])


def weight_read_seconds(params: Any, repeats: int) -> float:
    """Best time to read every parameter once (a jitted sum): the floor of a memory-bound decode step."""
    total = jax.jit(lambda p: sum(jnp.sum(leaf) for leaf in jax.tree.leaves(p)))
    return timed(lambda: jax.block_until_ready(total(params)), repeats)[1]


def decode_step_matrices(params: Any, config: ModelConfig) -> list[np.ndarray]:
    """The [out, in] matrices one decode step multiplies, laid out as `Block.decode_step` has them (per
    layer q/k/v fused, o, gate/up fused, down), then the output head."""
    attn, mlp = params["layers"]["self_attn"], params["layers"]["mlp"]
    kernels = lambda *parts: np.concatenate([np.asarray(part["kernel"]) for part in parts], axis=-1)
    per_layer = (kernels(attn["q_proj"], attn["k_proj"], attn["v_proj"]), kernels(attn["o_proj"]),
                 kernels(mlp["gate_proj"], mlp["up_proj"]), kernels(mlp["down_proj"]))
    head = (np.asarray(params["embed_tokens"]["embedding"]) if config.tie_word_embeddings
            else np.asarray(params["lm_head"]["kernel"]).T)
    matrices = [w[layer].T for layer in range(config.num_layers) for w in per_layer] + [head]
    return [np.array(w, order="C") for w in matrices]


def decode_matmul_seconds(params: Any, config: ModelConfig, batch: int, repeats: int) -> dict[str, float]:
    """Best time of one decode step's matmuls alone, each [out, in] @ [in, batch] on fixed inputs: XLA
    (jitted, as the step runs them) and torch (`F.linear`, its natural layout, at its current threads)."""
    import torch

    matrices = decode_step_matrices(params, config)
    rng = np.random.RandomState(0)
    inputs = [rng.standard_normal((w.shape[1], batch)).astype(np.float32) for w in matrices]
    xla = jax.jit(lambda ws, xs: [w @ x for w, x in zip(ws, xs)])
    ws, xs = [jnp.asarray(w) for w in matrices], [jnp.asarray(x) for x in inputs]
    tws, txs = [torch.from_numpy(w) for w in matrices], [torch.from_numpy(x.T.copy()) for x in inputs]

    def torch_step():
        with torch.inference_mode():
            return [torch.nn.functional.linear(x, w) for w, x in zip(tws, txs)]

    jax.block_until_ready(xla(ws, xs))
    torch_step()
    return best_of({"XLA": lambda: jax.block_until_ready(xla(ws, xs)), "torch": torch_step}, repeats)


def decode_step_breakdown(graphdef, params, prompts: np.ndarray, new: int) -> dict[str, float]:
    """Milliseconds of one decode step by kind of op: the op time of a `new`-token generation minus that
    of a 1-token one (the prefill), over new - 1 steps; op times of parallel threads add up."""
    def op_ms(tokens: int) -> collections.Counter:
        config = SamplingConfig(temperature=0.0, max_new_tokens=tokens)
        args = (graphdef, params, jnp.asarray(prompts), jnp.full(len(prompts), prompts.shape[1], jnp.int32),
                jax.random.key(0), config)
        return op_seconds(sampling._decode_jit, *args)

    full, prefill = op_ms(new), op_ms(1)
    return {kind: (full[kind] - prefill[kind]) / (new - 1) * 1e3 for kind in full}


def run(args: argparse.Namespace) -> float:
    import torch

    prompt_len, new = 64, 64
    rows, headline, breakdowns = [], float("nan"), {}
    for name, model_config, graphdef, params in models(args.models):
        reference = torch_model(model_config, params).eval()
        read_s = weight_read_seconds(params, args.repeats)
        for batch in args.batches:
            prompts = np.random.RandomState(batch).randint(1, model_config.vocab_size, (batch, prompt_len))
            input_ids = torch.from_numpy(prompts)

            def ours(tokens: int = new):
                config = SamplingConfig(temperature=0.0, max_new_tokens=tokens)
                out = generate(graphdef, params, prompts.astype(np.int32), np.full(batch, prompt_len),
                               jax.random.key(0), config)
                return jax.block_until_ready(out)

            def theirs(tokens: int = new):
                with torch.inference_mode():
                    return reference.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                              do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                                              pad_token_id=0)

            first, warm = timed(ours, 1)
            ours(1)  # compile the prefill-only program used for the time split
            threads = torch_threads(lambda: theirs(4))
            theirs()
            best = best_of({"ours": ours, "torch": theirs, "prefill": lambda: ours(1)}, args.repeats)
            ours_out, ref_tokens = ours(), theirs()[:, prompt_len:].numpy()
            assert int(ours_out.steps) == new, "every row must generate all its tokens"
            agree = float(np.mean(np.asarray(ours_out.tokens)[:, :8] == ref_tokens[:, :8]))
            ratio = best["torch"] / best["ours"]
            step_ms = (best["ours"] - best["prefill"]) / (new - 1) * 1e3
            # Forward FLOPs (a third of train_flops); a decode step's attention over the cache is not counted.
            prefill_gflops = train_flops(model_config, batch, prompt_len) / 3 / best["prefill"] / 1e9
            decode_gflops = train_flops(model_config, batch, 1) / 3 / step_ms * 1e3 / 1e9
            rows.append((name, batch, batch * new / best["ours"], batch * new / best["torch"], threads, ratio,
                         best["prefill"], prefill_gflops, step_ms, decode_gflops, read_s * 1e3, first - warm,
                         agree))
            print(f"  {name} batch {batch}: ours {best['ours']:.2f}s, torch {best['torch']:.2f}s "
                  f"({threads} threads), ratio {ratio:.2f}", flush=True)
            if name == "SmolLM2-135M" and batch == 16:
                headline = ratio
            if batch == args.batches[0]:
                kinds = decode_step_breakdown(graphdef, params, prompts.astype(np.int32), 17)
                matmuls = decode_matmul_seconds(params, model_config, batch, args.repeats)
                breakdowns[name, batch] = (kinds, step_ms, read_s * 1e3, matmuls, threads)
    print(f"\nsampler: greedy, prompt {prompt_len}, {new} new tokens, best of {args.repeats} alternating "
          "warm runs")
    print(f"{'model':<14}{'batch':>6}{'ours tok/s':>11}{'torch tok/s':>12}{'threads':>8}{'ratio':>7}"
          f"{'prefill s':>10}{'GFLOP/s':>8}{'decode ms/tok':>14}{'GFLOP/s':>8}{'read weights ms':>16}"
          f"{'compile s':>10}{'same 8 tok':>11}")
    for (name, batch, ours_tps, ref_tps, threads, ratio, prefill, prefill_gflops, step_ms, decode_gflops,
         read_ms, compile_s, agree) in rows:
        print(f"{name:<14}{batch:>6}{ours_tps:>11.0f}{ref_tps:>12.0f}{threads:>8}{ratio:>7.2f}"
              f"{prefill:>10.2f}{prefill_gflops:>8.0f}{step_ms:>14.1f}{decode_gflops:>8.0f}{read_ms:>16.1f}"
              f"{compile_s:>10.1f}{agree:>11.2f}")
    print("decode ms/tok: one decode step for the whole batch; GFLOP/s: forward matmul FLOPs per second of "
          "the prefill and of a decode step (a decode step's matmuls have only `batch` rows); read weights "
          "ms: one pass over all parameters (a memory-bound step's floor); threads: torch's faster setting")
    print("\nwhere a decode step goes (XLA op time of one step, 16 new tokens minus the prefill, summed over "
          "threads; the step's wall time against the weight-read floor):")
    for (name, batch), (kinds, step_ms, read_ms, matmuls, threads) in breakdowns.items():
        total = sum(kinds.values())
        parts = ", ".join(f"{kind} {ms:.1f} ms ({ms / total:.0%})"
                          for kind, ms in sorted(kinds.items(), key=lambda item: -item[1]))
        print(f"  {name} batch {batch}: step {step_ms:.1f} ms = {step_ms / read_ms:.2f} x {read_ms:.1f} ms; "
              f"{parts}")
        print(f"    the step's matmuls alone ([out, in] @ [in, {batch}]): XLA {matmuls['XLA'] * 1e3:.1f} ms, "
              f"torch F.linear {matmuls['torch'] * 1e3:.1f} ms ({threads} threads)")
    return headline
