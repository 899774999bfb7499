"""Performance benchmarks, each side by side with a reference: python -m experiments.bench NAME [--repeats N].

Every benchmark prints a table and ends with one line `ratio=<ours/reference>` (its headline ratio).
Timed runs of ours and of the reference alternate and each keeps its best of --repeats warm runs
(compilation is excluded and reported separately): on a machine shared with other processes, load only
ever makes a run slower, and alternating exposes both sides to the same load.

  sampler     generated tokens/s of `scope_jax.sampling.generate` (greedy, prompt 64, 64 new tokens, no
              early stop) against transformers `generate` in PyTorch on the same float32 weights, batch 16
              and 64, for a ~5M-parameter random Llama and SmolLM2-135M. Headline: SmolLM2 at batch 16.
              Where the time goes: prefill vs per-token decode, against the time to read every weight
              once (what a decode step costs at least when it is memory-bound), a decode step's XLA
              op time by kind (layer matmuls, output head, attention, cache writes, sampling, copies),
              and the step's matmuls alone, in XLA and in torch (what thin matmuls cost each of them).
  rollout     multi-turn greedy rollouts at the sampler level, batch 16, on synthetic dialogues (a shared
              system prompt, then per turn a fixed random 'other side' message and template tokens, and
              the model's own reply of `message` tokens, no early stop; the same inputs for every column):
              ours with per-row KV caches kept across turns and a shared prefix (`scope_jax.kv_cache`),
              ours re-prefilling every view (`scope_jax.sampling.generate`), transformers `generate` per
              turn on the whole history, and transformers carrying its `past_key_values` (DynamicCache)
              across turns. Shapes: p4g (10 turns, 40-token messages, 512-token prompt) and tau2 (20
              turns, 40-token messages, 4,096-token prompt). Generated tokens/s, wall time, and the peak
              resident memory each column adds (peak RSS above the RSS before it, the weights already
              loaded). The re-prefilling columns play the first --turns turns (default: all, fewer where
              QUICK_TURNS says so; --full: all), the two incremental ones every turn; where the former
              stop early, a second table gives each column's time over the whole dialogue: measured for
              the incremental columns, a lower bound for the others (each unplayed turn re-prefills a
              longer history than any played one, so takes at least the fastest played turn's time).
              Headline: ours cached over transformers re-prefilling, SmolLM2, p4g shape.
  train_step  forward + backward of the masked mean token log-prob loss (`scope_jax.logprobs`), batch
              8 x 256, tokens/s against PyTorch on the same weights, and achieved GFLOP/s against this
              machine's float32 matmul peak measured in the same run. Headline: SmolLM2. Where the time
              goes: XLA op time by kind, from a profile of one step.
  sft         one LoRA SFT step (forward + backward + AdamW update of the adapter, gradient clipping
              included) on the masked next-token NLL, batch 8 x 256: ours (`scope_jax.training.sft_step`
              on a `scope_jax.models.lora` base + adapter, jitted, state donated) against transformers +
              peft LoRA on the same float32 weights, the same tokens and mask, rank, alpha and target
              projections (all seven), in tokens/s. Both adapters start with B = 0, so both first losses
              are the base model's: their difference is printed. Headline: SmolLM2. Without peft installed
              the reference column is nan (pip install peft).
  collapse    see `bench_collapse` (wall and process CPU time; the ratio is wall time over the budget).
  distributed episodes/s of the RL step's rollout on 1 and on 2 processes of one CPU device each
              (experiments.launch_local; the 2-process job shares the groups out in 2 shards): ratio=<2/1>.
  rl_step     one RL step of the target-word example config (experiments/configs/target_word.py, tiny
              random agent and simulator; --mode picks the simulator mode), run through the host loop's
              own functions: time split into rollout (reward timed on its own), advantages, batch building,
              log-prob recomputation and update, compile time apart; the update's GFLOP/s against this
              machine's float32 matmul peak. Its reference is the peak: ratio=<achieved/peak>. The phases
              and the peak's matmul alternate in the same warm rounds (the update donates the state, so
              the rollout samples with a copy of the initial parameters). Where the loop has no
              separate log-prob recomputation (behaviour log-probs come from the sampler; the reference
              forward of a KL term runs inside the update), its row is the forward pass such a recompute
              would cost, marked as not part of the step.

The sampler, rollout, train_step and sft headlines are SmolLM2's: without the SmolLM2 wheel they print
ratio=nan.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import kv_cache, sampling
from scope_jax.logprobs import token_logprobs
from scope_jax.models import ModelConfig, from_pretrained, init, save_pretrained
from scope_jax.sampling import SamplingConfig, generate

# A Llama-type model of about 5M parameters (random weights).
SMALL = ModelConfig(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5)
SMOLLM2 = "smollm2-135m-instruct"

BENCHMARKS: dict[str, Callable[[argparse.Namespace], float]] = {}


def benchmark(fn: Callable[[argparse.Namespace], float]) -> Callable[[argparse.Namespace], float]:
    """Register `bench_NAME` as the benchmark NAME; it prints its table and returns its headline ratio."""
    BENCHMARKS[fn.__name__.removeprefix("bench_")] = fn
    return fn


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(seconds of the first call, best seconds of `repeats` further calls); fn must block until done."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    return first, best_of({"fn": fn}, repeats)["fn"]


def best_of(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best seconds of each warm (already compiled) function over `repeats` rounds that alternate them."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def models(names: list[str]) -> Iterator[tuple[str, ModelConfig, Any, Any]]:
    """(name, config, graphdef, params) of the benchmark models: "5m" (random) and "smollm2" (real)."""
    for name in names:
        if name == "5m":
            yield "random-5M", SMALL, *init(SMALL, seed=0)
        else:
            try:
                config, (graphdef, params), _ = from_pretrained(SMOLLM2)
            except FileNotFoundError as err:
                print(f"SmolLM2-135M is missing, so the headline ratio is nan: {err}")
                continue
            yield "SmolLM2-135M", config, graphdef, params


def torch_model(config: ModelConfig, params: Any):
    """The transformers *ForCausalLM with the same float32 weights (through `save_pretrained`)."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(params, config, None, folder)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")


def torch_threads(probe: Callable[[], Any]) -> int:
    """Set torch's intra-op threads to whichever of (all cores, 1) runs `probe` faster, and return it.

    On a machine shared with other processes, torch's OpenMP threads spin-wait for each other and one
    thread can be many times faster than all cores; the reference gets whichever is better right now.
    """
    import torch

    seconds = {}
    for threads in dict.fromkeys((os.cpu_count(), 1)):
        torch.set_num_threads(threads)
        seconds[threads] = timed(probe, 1)[1]
    best = min(seconds, key=seconds.get)
    torch.set_num_threads(best)
    return best


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


@benchmark
def bench_sampler(args: argparse.Namespace) -> float:
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


@dataclasses.dataclass(frozen=True)
class RolloutShape:
    """A synthetic dialogue: `turns` replies of `message` tokens after a shared `prompt`-token prompt, each
    reply preceded by an other-side message of `message` tokens wrapped in TEMPLATE_TOKENS template ids."""

    turns: int
    message: int
    prompt: int


ROLLOUT_SHAPES = {"p4g": RolloutShape(turns=10, message=40, prompt=512),
                  "tau2": RolloutShape(turns=20, message=40, prompt=4096)}
TEMPLATE_TOKENS = 8  # e.g. "<|im_end|>\n<|im_start|>user\n" before and "...assistant\n" after a message
# Turns the re-prefilling columns play by default where all of them take hours on a 2-core CPU (--full: all).
QUICK_TURNS = {("SmolLM2-135M", "tau2"): 2}


def peak_rss_above(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), the peak resident memory in bytes it added above the RSS before it): Linux's peak RSS is reset
    (/proc/self/clear_refs) before the call and read after it."""
    def status(field: str) -> float:
        with open("/proc/self/status") as f:
            return next(float(line.split()[1]) * 1024 for line in f if line.startswith(field))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS:")
    out = fn()
    return out, status("VmHWM:") - before


@dataclasses.dataclass(frozen=True)
class Played:
    """One played dialogue: each turn's replies [rows, reply_tokens] and its wall seconds."""

    replies: list[np.ndarray]
    seconds: list[float]


@dataclasses.dataclass(frozen=True)
class SyntheticDialogue:
    """The fixed inputs of one rollout: the first history [rows, prompt + message + template] (a shared
    prompt, then each row's first other-side turn) and the other side's later turns [turns, rows, ...]."""

    first: np.ndarray
    others: np.ndarray
    reply_tokens: int

    @classmethod
    def make(cls, shape: RolloutShape, turns: int, rows: int, vocab: int) -> "SyntheticDialogue":
        rng = np.random.RandomState(0)
        prompt = np.broadcast_to(rng.randint(1, vocab, shape.prompt), (rows, shape.prompt))
        others = rng.randint(1, vocab, (turns, rows, shape.message + TEMPLATE_TOKENS)).astype(np.int32)
        return cls(np.concatenate([prompt, others[0]], axis=1).astype(np.int32), others, shape.message)

    def history_lengths(self) -> list[int]:
        """The length of the history each turn replies to."""
        grown = self.reply_tokens + self.others.shape[2]  # a reply, then the other side's next turn
        return [self.first.shape[1] + turn * grown for turn in range(len(self.others))]

    def play(self, reply: Callable[[np.ndarray], np.ndarray], turns: int | None = None) -> Played:
        """The first `turns` turns (default: all); `reply` maps the history so far to the turn's replies."""
        history, played = self.first, Played([], [])
        for turn in range(turns or len(self.others)):
            start = time.perf_counter()
            played.replies.append(np.asarray(reply(history)))
            played.seconds.append(time.perf_counter() - start)
            if turn + 1 < len(self.others):
                history = np.concatenate([history, played.replies[-1], self.others[turn + 1]], axis=1)
        return played


PlayFn = Callable[..., Played]  # play(turns=None): the first `turns` turns of the dialogue (default all)


def ours_rollout_columns(graphdef, params, dialogue: SyntheticDialogue, mesh=None) -> dict[str, PlayFn]:
    """{column: play the dialogue greedily}: with per-row caches kept across turns (one group, so the
    prompt is a shared prefix), and re-prefilling every turn's history."""
    config = SamplingConfig(temperature=0.0, max_new_tokens=dialogue.reply_tokens)
    key, rows = jax.random.key(0), len(dialogue.first)

    def cached(turns: int | None = None) -> Played:
        cache = kv_cache.create(graphdef, params, rows, mesh=mesh)

        def reply(history):
            nonlocal cache
            out, cache = kv_cache.generate(graphdef, params, cache, list(history), key, config)
            return out.tokens

        return dialogue.play(reply, turns)

    def reprefilling(turns: int | None = None) -> Played:
        reply = lambda history: reprefilled_reply(graphdef, params, history, config, mesh)
        return dialogue.play(reply, turns)

    return {"ours, cached": cached, "ours, re-prefilling": reprefilling}


def reprefilled_reply(graphdef, params, history: np.ndarray, config: SamplingConfig, mesh=None) -> np.ndarray:
    """Ours re-prefilling: the replies [rows, max_new_tokens] to whole histories [rows, length]."""
    lengths, key = np.full(len(history), history.shape[1]), jax.random.key(0)
    return jax.device_get(generate(graphdef, params, history, lengths, key, config, mesh).tokens)


def reprefilling_compiles(dialogue: SyntheticDialogue, turns: int) -> list[int]:
    """The turns (of the first `turns`) at which ours re-prefilling meets a new padded history length,
    so compiles a new program: `generate` pads each history to `bucket(length, MIN_PROMPT_BUCKET)`."""
    first_turn = {}
    for turn, length in enumerate(dialogue.history_lengths()[:turns]):
        first_turn.setdefault(sampling.bucket(length, sampling.MIN_PROMPT_BUCKET), turn)
    return sorted(first_turn.values())


def torch_rollout_columns(reference, dialogue: SyntheticDialogue) -> dict[str, PlayFn]:
    """{column: play the dialogue greedily with transformers}: `generate` on the whole history each turn,
    and the same carrying its DynamicCache across turns (it then prefills only the new tokens)."""
    import torch
    from transformers import DynamicCache

    def reply(history, cache=None):
        ids = torch.from_numpy(history.astype(np.int64))
        with torch.inference_mode():
            new = dialogue.reply_tokens
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=new, min_new_tokens=new, pad_token_id=0, cache=cache)
        return out[:, history.shape[1]:].numpy()

    def reprefilling(turns: int | None = None) -> Played:
        return dialogue.play(reply, turns)

    def carrying_cache(turns: int | None = None) -> Played:
        cache = DynamicCache()
        return dialogue.play(lambda history: reply(history, cache), turns)

    return {"transformers, re-prefilling": reprefilling, "transformers, past_key_values": carrying_cache}


# Columns that keep what they computed across turns: cheap enough to play every turn of every shape.
INCREMENTAL = ("ours, cached", "transformers, past_key_values")


def full_dialogue_seconds(measured: list[float], turns: int) -> float:
    """A lower bound on a re-prefilling column's wall time over all `turns` turns from its first measured
    ones: each later turn re-prefills a longer history (and decodes the same tokens over a longer cache),
    so takes at least as long as the fastest measured turn."""
    return sum(measured) + (turns - len(measured)) * min(measured)


ROLLOUT_TABLE = (  # (label, key, format) of each column of the rollout table
    ("model", "model", "{:<13}"), ("shape", "shape", "{:<5}"), ("turns", "turns", "{:>5}"),
    ("column", "column", "{:<29}"), ("gen tok/s", "tokens_per_s", "{:>9.1f}"),
    ("wall s", "seconds", "{:>7.1f}"), ("s/turn", "turn_s", "{:>6.2f}"), ("cached x", "speedup", "{:>8.2f}"),
    ("peak MiB", "peak_mib", "{:>8.0f}"), ("compile s", "compile_s", "{:>9}"),
    ("same tok", "same", "{:>8.2f}"),
)
FULL_DIALOGUE_TABLE = (  # the whole shape, where the re-prefilling columns ran only its first turns
    ("model", "model", "{:<13}"), ("shape", "shape", "{:<5}"), ("column", "column", "{:<29}"),
    ("measured turns", "measured", "{:>14}"), ("wall s, all turns", "seconds", "{:>17}"),
    ("cached x", "speedup", "{:>8}"),
)


def print_table(rows: list[dict[str, Any]], spec: tuple[tuple[str, str, str], ...]) -> None:
    """Rows (dicts) as aligned columns, one per (label, key, format) of `spec`, separated by a space."""
    widths = [max(len(label), len(fmt.format(row[key]))) for row in rows[:1] for label, key, fmt in spec]
    print(" ".join(f"{label:>{w}}" if ">" in fmt else f"{label:<{w}}"
                   for (label, _, fmt), w in zip(spec, widths)))
    for row in rows:
        print(" ".join(f"{fmt.format(row[key]):>{w}}" if ">" in fmt else f"{fmt.format(row[key]):<{w}}"
                       for (_, key, fmt), w in zip(spec, widths)))


@benchmark
def bench_rollout(args: argparse.Namespace) -> float:
    import torch

    rows, table, full_table, ratios = 16, [], [], {}
    shapes = {name: ROLLOUT_SHAPES[name] for name in args.shapes}
    for name, model_config, graphdef, params in models(args.models):
        reference = torch_model(model_config, params).eval()
        threads = torch_threads(lambda: reference.generate(torch.ones((rows, 8), dtype=torch.long),
                                                           max_new_tokens=4, pad_token_id=0))
        for shape_name, shape in shapes.items():
            quick = QUICK_TURNS.get((name, shape_name), shape.turns)
            turns = min(args.turns or (shape.turns if args.full else quick), shape.turns)
            dialogue = SyntheticDialogue.make(shape, shape.turns, rows, model_config.vocab_size)
            ours = ours_rollout_columns(graphdef, params, dialogue)
            columns = {**ours, **torch_rollout_columns(reference, dialogue)}
            played_turns = {column: shape.turns if column in INCREMENTAL else turns for column in columns}
            # Compile: the cached column's whole dialogue; one re-prefill per padded history length.
            warm_turns = reprefilling_compiles(dialogue, turns)
            config = SamplingConfig(temperature=0.0, max_new_tokens=shape.message)
            warm_up = {"ours, cached": lambda: ours["ours, cached"](),
                       "ours, re-prefilling": lambda: [
                           reprefilled_reply(graphdef, params, np.ones((rows, length), np.int32), config)
                           for length in np.array(dialogue.history_lengths())[warm_turns]]}
            first = {column: timed(fn, 0)[0] for column, fn in warm_up.items()}
            print(f"    {name} {shape_name}: compiled, warm in {sum(first.values()):.0f}s", flush=True)
            best = dict.fromkeys(columns, float("inf"))
            played, peak = {}, dict.fromkeys(columns, 0.0)
            for _ in range(args.repeats):  # alternating, as best_of, with each run's peak memory
                for column, play in columns.items():
                    run, added = peak_rss_above(lambda: play(played_turns[column]))
                    if sum(run.seconds) < best[column]:
                        best[column], played[column] = sum(run.seconds), run
                    peak[column] = max(peak[column], added)
                    print(f"    {name} {shape_name}, {column}: {played_turns[column]} turns in "
                          f"{sum(run.seconds):.1f}s", flush=True)
            # The first `turns` turns of every column, like for like.
            seconds = {column: sum(played[column].seconds[:turns]) for column in columns}
            compile_s = {"ours, cached": first["ours, cached"] - best["ours, cached"],
                         "ours, re-prefilling": first["ours, re-prefilling"]
                         - sum(played["ours, re-prefilling"].seconds[turn] for turn in warm_turns)}
            reprefilled = np.concatenate(played["ours, re-prefilling"].replies, 1)
            for column in columns:
                table.append(dict(
                    model=name, shape=shape_name, turns=f"{turns}/{shape.turns}", column=column,
                    tokens_per_s=rows * turns * shape.message / seconds[column], seconds=seconds[column],
                    turn_s=seconds[column] / turns, speedup=seconds[column] / seconds["ours, cached"],
                    peak_mib=peak[column] / 2**20,
                    compile_s=f"{compile_s[column]:.1f}" if column in compile_s else "",
                    same=float(np.mean(np.concatenate(played[column].replies[:turns], 1) == reprefilled))))
                if turns < shape.turns:  # the incremental columns measured; a bound for the others
                    measured = played[column].seconds
                    full, bound = ((sum(measured), "") if column in INCREMENTAL else
                                   (full_dialogue_seconds(measured, shape.turns), ">= "))
                    full_table.append(dict(
                        model=name, shape=shape_name, column=column,
                        measured=f"{len(measured)}/{shape.turns}", seconds=f"{bound}{full:.1f}",
                        speedup=f"{bound}{full / best['ours, cached']:.2f}"))
            ratios[name, shape_name] = seconds["transformers, re-prefilling"] / seconds["ours, cached"]
            times = ", ".join(f"{column} {seconds[column]:.1f}s" for column in columns)
            print(f"  {name} {shape_name} ({turns} turns): {times}; ratio {ratios[name, shape_name]:.2f}",
                  flush=True)
    described = "; ".join(f"{n} = {s.turns} turns of {s.message}-token replies after {s.message}-token "
                          f"messages (+{TEMPLATE_TOKENS} template tokens), {s.prompt}-token shared prompt"
                          for n, s in shapes.items())
    print(f"\nrollout: greedy, batch {rows}, no early stop; best of {args.repeats} alternating warm "
          f"dialogues; torch {threads} thread(s); shapes: {described}")
    print_table(table, ROLLOUT_TABLE)
    print("turns: the first ones, as many as the re-prefilling columns ran (--full: all); s/turn: wall s / "
          "turns; cached x: this column's wall time over ours cached; peak MiB: peak RSS added over the RSS "
          "before the column's run (the weights already loaded; the incremental columns, ours cached and "
          "transformers past_key_values, run every turn of the shape); compile s: jax compilation (the "
          "cached column's first dialogue, the re-prefilling column's first call at each padded length, "
          "over the same warm work); same tok: replies equal to ours re-prefilling's")
    if full_table:
        print("\nall turns of the shape: the incremental columns measured; the re-prefilling columns at "
              "least their measured turns plus each later turn at their fastest measured turn's time (a "
              "later turn re-prefills a longer history)")
        print_table(full_table, FULL_DIALOGUE_TABLE)
    print("headline: SmolLM2-135M, p4g shape: ours cached over transformers re-prefilling")
    return ratios.get(("SmolLM2-135M", "p4g"), float("nan"))


DECODE_KINDS = (  # (kind, pattern of the jax op name or HLO instruction) in the order they are tried;
    # the head is token-major in the prefill and feature-major (vd,db->vb) in the decode loop
    ("output head", r"\.\.\.d,dv->\.\.\.v|vd,db->vb"), ("attention", r"nhqd,nhsd->nhqs|nhqs,nhsd->nhqd"),
    ("layer matmuls", r"dot_general|^dot|ynn"), ("cache writes", r"dynamic.update.slice|scatter"),
    ("sampling", r"argmax|log_softmax|top_k|categorical|reduce_max|exp|sort"),
    ("copies / transposes", r"^copy|^transpose|\bcopy"),
)


def compiled_ops(fn: Callable, *args) -> dict[str, str]:
    """{HLO instruction: jax op name} of jitted `fn` compiled for `args`."""
    hlo = fn.lower(*args).compile().as_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+%(\S+) = .*?op_name=\"([^\"]*)\"", hlo, re.M)}


def op_kind(name: str, op: str) -> str:
    """The DECODE_KINDS kind of HLO instruction `name` with jax op name `op` (else "other")."""
    matches = (kind for kind, pattern in DECODE_KINDS if re.search(pattern, op) or re.search(pattern, name))
    return next(matches, "other")


def profiled_ops(fn: Callable, *args) -> Iterator[tuple[str, str, float]]:
    """(HLO instruction, jax op name, seconds) of each XLA op run by one profiled call of jitted `fn`
    (while loops left out: their bodies' ops are counted)."""
    ops = compiled_ops(fn, *args)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            jax.block_until_ready(fn(*args))
        with gzip.open(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)[0]) as f:
            events = json.load(f)["traceEvents"]
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and name in ops and not name.startswith("while"):
            yield name, ops[name], event["dur"] / 1e6


def op_seconds(fn: Callable, *args) -> collections.Counter:
    """XLA op seconds of one profiled call of jitted `fn`, by DECODE_KINDS (else "other")."""
    seconds = collections.Counter()
    for name, op, duration in profiled_ops(fn, *args):
        seconds[op_kind(name, op)] += duration
    return seconds


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


def matmul_fns(size: int = 4096) -> tuple[float, dict[str, Callable[[], Any]]]:
    """(FLOPs, {"jax": jitted jnp.dot, "numpy": numpy @}) of one float32 size x size matmul, compiled."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    dot = jax.jit(jnp.dot)
    a_np, b_np = np.asarray(a), np.asarray(b)
    dot(a, b).block_until_ready()
    return 2 * size**3, {"jax": lambda: dot(a, b).block_until_ready(), "numpy": lambda: a_np @ b_np}


def matmul_peak(size: int = 4096, repeats: int = 3) -> tuple[float, float]:
    """Measured float32 matmul GFLOP/s of this machine: (jitted jnp.dot, numpy), size x size operands."""
    flops, fns = matmul_fns(size)
    best = best_of(fns, repeats)
    return flops / best["jax"] / 1e9, flops / best["numpy"] / 1e9


def train_flops(config: ModelConfig, batch: int, length: int) -> float:
    """Model FLOPs of one forward + backward: 6 N T + 12 layers B L^2 heads head_dim.

    N counts the matmul parameters (every layer's projections and the output head, not the embedding
    lookup), T = B L tokens; the second term is the two attention matmuls (QK^T and AV, dense over the
    causal square) times 3 for forward + backward. Recomputation (remat, the chunked head) is not counted.
    """
    c = config
    layer = c.num_layers * (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
                            + 3 * c.hidden_size * c.intermediate_size)
    head = c.hidden_size * c.vocab_size
    attention = 12 * c.num_layers * batch * length**2 * c.num_heads * c.head_dim
    return 6 * (layer + head) * batch * length + attention


def op_time_breakdown(fn: Callable, *args) -> dict[tuple[str, str], float]:
    """Seconds of XLA op time by (forward / backward, kind) in one profiled call of jitted `fn`.

    Kinds: "matmul" (dot fusions), "transpose/copy" (layout changes, often fused with elementwise
    work), "other" (elementwise, reductions, slicing). Op times of parallel threads add up, so the
    total can exceed the wall time.
    """
    seconds = collections.Counter()
    for name, op, duration in profiled_ops(fn, *args):
        phase = "backward" if "transpose(jvp" in op else "forward"
        if name.startswith("dot") or name.startswith("ynn") and op.endswith("dot_general"):
            kind = "matmul"
        elif "transpose" in name or "copy" in name:
            kind = "transpose/copy"
        else:
            kind = "other"
        seconds[(phase, kind)] += duration
    return dict(seconds)


@benchmark
def bench_train_step(args: argparse.Namespace) -> float:
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
        input_ids, target_mask = torch.from_numpy(tokens_np), torch.from_numpy(mask_np)[:, 1:]

        def torch_loss():
            logits = reference(input_ids).logits[:, :-1]
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
            return -(logprobs * target_mask).sum() / target_mask.sum()

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


SFT_LORA = dict(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"))
SFT_TABLE = (  # (label, key, format) of each column of the sft table
    ("model", "model", "{:<13}"), ("ours tok/s", "ours_tokens_per_s", "{:>10.0f}"),
    ("peft tok/s", "peft_tokens_per_s", "{:>10.0f}"), ("torch threads", "threads", "{:>13}"),
    ("ratio", "ratio", "{:>6.2f}"), ("ours s", "ours_s", "{:>7.3f}"), ("peft s", "peft_s", "{:>7.3f}"),
    ("ours compile s", "compile_s", "{:>14.1f}"), ("ours adapter", "ours_adapter", "{:>12,}"),
    ("peft adapter", "peft_adapter", "{:>12}"), ("|first loss diff|", "loss_diff", "{:>17.1e}"),
)


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
    input_ids, target_mask = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(mask)[:, 1:]

    def run() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids).logits[:, :-1]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
        loss = -(logprobs * target_mask).sum() / target_mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return float(loss.detach())

    return run, sum(p.numel() for p in trainable)


@benchmark
def bench_sft(args: argparse.Namespace) -> float:
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


COLLAPSE_TABLE = (  # (label, key, format) of each column of the collapse table
    ("config", "config", "{:<8}"), ("wall s", "wall", "{:>7.0f}"), ("CPU s", "cpu", "{:>7.0f}"),
    ("load 1m", "load", "{:>10}"), ("budget", "budget", "{:>6.0f}"), ("wall/budget", "ratio", "{:>11.0%}"),
)


@benchmark
def bench_collapse(args: argparse.Namespace) -> float:
    """The collapse testbed end to end (`experiments.run`, fresh run directories), default, quick and data
    configs (and scarce, when asked), against their budgets of wall time on the 2-core CPU (600 s, 120 s,
    1,200 s and 1,800 s). The data
    config reuses the default's pretraining and controls, as it is meant to: when the default ran first
    in this call, its `pretrained.msgpack` and control arms are copied into the data run's directory
    before it starts (without the default, the data run pretrains for itself). Reports wall time,
    the run's process CPU time (user + system, its threads summed: the testbed runs its arms on two
    threads, so CPU time exceeds wall time) and the 1-minute load average before and after, which says
    whether the machine was quiet: under other jobs the wall time measures them too. Headline: default
    wall seconds / 600. --collapse-configs runs a subset (the headline is NaN without the default);
    --collapse-keep DIR keeps the run directories there (DIR/default, DIR/quick, DIR/data)."""
    import resource
    import subprocess
    import sys

    import shutil

    from scope_jax.testbed import experiment

    budgets = {"default": 600.0, "quick": 120.0, "data": 1200.0, "scarce": 1800.0}
    measured = {}
    child_cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
    with contextlib.ExitStack() as stack:
        folder = args.collapse_keep or stack.enter_context(tempfile.TemporaryDirectory())
        for name in args.collapse_configs:
            spec = "experiments/configs/collapse.py" + ("" if name == "default" else f":{name}")
            if name == "data" and "default" in measured:
                for part in (experiment.PRETRAINED, *(f"{experiment.ARMS_DIR}/{arm}.msgpack"
                                                      for arm in ("untrained", "frozen", "frozen_base"))):
                    target = os.path.join(folder, name, part)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copy(os.path.join(folder, "default", part), target)
            load, cpu, start = os.getloadavg()[0], child_cpu(), time.perf_counter()
            subprocess.run([sys.executable, "-m", "experiments.run", f"--config={spec}",
                            f"--workdir={os.path.join(folder, name)}"], check=True, capture_output=True)
            measured[name] = (time.perf_counter() - start, child_cpu() - cpu, load, os.getloadavg()[0])
            print(f"  collapse {name}: wall {measured[name][0]:.0f}s, CPU {measured[name][1]:.0f}s "
                  f"(budget {budgets[name]:.0f}s)", flush=True)
    print(f"\ncollapse: end to end, {os.cpu_count()} CPU threads; ratio = wall seconds / budget")
    print_table([dict(config=name, wall=wall, cpu=cpu, load=f"{before:.1f} -> {after:.1f}",
                      budget=budgets[name], ratio=wall / budgets[name])
                 for name, (wall, cpu, before, after) in measured.items()], COLLAPSE_TABLE)
    return measured["default"][0] / budgets["default"] if "default" in measured else float("nan")


def recompute_logprobs(setup, params: Any, batch: Any) -> dict[str, jax.Array]:
    """Forward token log-probs of each trained role over its training batch, with the loss's settings:
    what recomputing the old policy's (or the reference's) log-probs for the update costs."""
    from scope_jax.training.loss import LossConfig

    def role(graphdef, role_params, role_batch, config: LossConfig) -> jax.Array:
        return token_logprobs(graphdef, role_params, role_batch.tokens, role_batch.positions,
                              chunk_size=config.chunk_size, temperature=config.temperature,
                              allowed=config.allowed_tokens).logprobs

    step_config, agent_graphdef = setup.step_config, setup.agent.graphdef
    out = {"agent": role(agent_graphdef, params["agent"], batch.agent, step_config.agent)}
    if batch.sims is not None:
        if step_config.self_play:  # one set of weights plays both roles
            out["sims"] = jax.vmap(lambda b: role(agent_graphdef, params["agent"], b, step_config.sims))(
                batch.sims)
        else:
            sim_graphdef = setup.mode.sim_player(setup.sims).graphdef
            out["sims"] = jax.vmap(lambda p, b: role(sim_graphdef, p, b, step_config.sims))(
                params["sims"], batch.sims)
    return out


@benchmark
def bench_rl_step(args: argparse.Namespace) -> float:
    """One RL step of the target-word example config (`experiments/configs/target_word.py:MODE`, tiny
    random agent and simulator) through the host loop's own functions, split into rollout (its reward part
    timed on its own), advantages, batch, log-prob recomputation and update; the update's GFLOP/s against
    the measured matmul peak (headline)."""
    from flax import nnx

    from experiments.configs.target_word import get_config
    from scope_jax.training import rl_step as rl
    from scope_jax.training import state as joint
    from scope_jax.training.setup import build
    from scope_jax.training.train_step import compile_train_step

    config = get_config(args.mode)
    setup = build(config)
    mesh = setup.mesh
    state = jax.device_put(setup.state, joint.state_shardings(setup.state, mesh))
    # (model config, parameter count) of each role's model, read before the update donates the params.
    models_by_role = {"agent": (nnx.merge(setup.agent.graphdef, setup.agent.params).config,
                                sum(x.size for x in jax.tree.leaves(setup.agent.params)))}
    sim = setup.mode.sim_player(setup.sims)
    if sim is not None and sim is setup.sims.members:  # a stacked population's first member
        member = jax.tree.map(lambda x: x[0], sim.params)
        models_by_role["sims"] = (nnx.merge(sim.graphdef, member).config,
                                  sum(x.size for x in jax.tree.leaves(member)))
    else:  # self-play: the agent's model plays the simulator (or no simulator trains)
        models_by_role["sims"] = models_by_role["agent"]
    # The rollout samples with a copy of the parameters: the update donates (and replaces) the state.
    sample_state = jax.tree.map(jnp.copy, state)
    step, first = 0, {}

    def first_call(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = fn()
        first[name] = time.perf_counter() - start
        return out

    def update():
        nonlocal state
        state, metrics = step_fn(state, batch)
        return jax.device_get(metrics)

    # name: (what it runs, how it stands to the loop's step: one of its phases, a part of the rollout
    # phase timed on its own, or extra work the loop does not do)
    phases = {
        "rollout": (lambda: rl.play_episodes(setup, sample_state, step), "phase"),
        "reward": (lambda: [setup.env.rewards(episode) for episode in episodes], "in rollout"),
        "advantage": (lambda: rl.role_advantages(setup, episodes), "phase"),
        "batch": (lambda: rl.make_batch(setup, episodes, advantages, step), "phase"),
        "logprobs": (lambda: jax.block_until_ready(recompute(state.params, batch)), "extra"),
        "update": (update, "phase"),
    }
    episodes = first_call("rollout", phases["rollout"][0])
    first_call("reward", phases["reward"][0])
    advantages = first_call("advantage", phases["advantage"][0])
    batch = first_call("batch", phases["batch"][0])
    step_fn = compile_train_step(setup.train_step, state, batch, mesh)
    recompute = jax.jit(lambda params, batch: recompute_logprobs(setup, params, batch))
    first_call("logprobs", phases["logprobs"][0])
    first_call("update", update)
    # The matmul peak is measured in the same alternating rounds, under the same load as the phases.
    matmul_flops, matmul = matmul_fns()
    best = best_of({**{name: fn for name, (fn, _) in phases.items()},
                    **{f"peak {name}": fn for name, fn in matmul.items()}}, args.repeats)
    jax_peak, numpy_peak = (matmul_flops / best[f"peak {name}"] / 1e9 for name in ("jax", "numpy"))

    flops, forward_flops, shapes = 0.0, 0.0, []
    for role, role_batch in (("agent", batch.agent), ("sims", batch.sims)):
        if role_batch is None:
            continue
        model_config, count = models_by_role[role]
        rows, length = int(np.prod(role_batch.tokens.shape[:-1])), role_batch.tokens.shape[-1]
        role_flops = train_flops(model_config, rows, length)
        loss_config = getattr(setup.step_config, role)
        flops += role_flops * (4 / 3 if loss_config.kl_coef else 1)  # + the reference's forward (1/3)
        forward_flops += role_flops / 3
        shapes.append(f"{role} {'x'.join(map(str, role_batch.tokens.shape))} tokens "
                      f"({int(role_batch.loss_mask.sum())} trained), {count:,} parameters "
                      f"(hidden {model_config.hidden_size}, {model_config.num_layers} layers, "
                      f"vocab {model_config.vocab_size})")
    loop_step = sum(best[name] for name, (_, kind) in phases.items() if kind == "phase")
    achieved = flops / best["update"] / 1e9
    print(f"\nrl_step: experiments/configs/target_word.py:{args.mode}, {config.rollout.groups} groups x "
          f"{config.rollout.group_size} episodes, {config.env.max_turns} turns per role, "
          f"{config.sampling.max_new_tokens} new tokens per turn; best of {args.repeats} alternating warm "
          "rounds")
    for line in shapes:
        print(f"  trained batch: {line}")
    print(f"{'phase':<10}{'seconds':>9}{'of step':>9}{'compile s':>11}  what")
    what = {
        "rollout": "rl_step.play_episodes: scenarios, batched turns (jitted generate), env.rewards at end",
        "reward": "env.rewards on every episode: the end of the rollout, timed on its own",
        "advantage": "rl_step.role_advantages: group advantages from the rewards",
        "batch": "rl_step.make_batch: each role's grown token views -> padded arrays",
        "logprobs": "NOT a loop phase here*: forward token_logprobs over the trained batch",
        "update": "the jitted train step (compile_train_step), state donated",
    }
    for name, (_, kind) in phases.items():
        share = {"phase": "{:.0%}", "in rollout": "({:.0%})", "extra": "+{:.0%}"}[kind].format(
            best[name] / loop_step)
        compile_s = max(first[name] - best[name], 0.0)
        print(f"{name:<10}{best[name]:>9.4f}{share:>9}{compile_s:>11.2f}  {what[name]}")
    print(f"{'step':<10}{loop_step:>9.4f}{'100%':>9}{'':>11}  rollout + advantage + batch + update")
    kl = ", ".join(f"{role} kl_coef {getattr(setup.step_config, role).kl_coef}"
                   for role in ("agent", "sims") if getattr(setup.step_config, role) is not None)
    print(f"* old log-probs come from the sampler and the reference is kept only for kl_coef > 0 ({kl}); "
          "with kl_coef > 0 the reference forward runs inside the update. The row is what a separate "
          "recompute would add (+ share of the step).")
    print(f"update: {flops / 1e9:.3f} GFLOP (train_flops of each trained role over its padded batch, plus "
          f"the reference forward where kl_coef > 0) in {best['update'] * 1e3:.1f} ms = {achieved:.1f} "
          f"GFLOP/s; "
          f"log-prob forward {forward_flops / best['logprobs'] / 1e9:.1f} GFLOP/s")
    print(f"float32 matmul peak, 4096^3, measured in the same rounds: jax {jax_peak:.0f} GFLOP/s, numpy "
          f"{numpy_peak:.0f} GFLOP/s; update at {achieved / jax_peak:.1%} of the jax peak")
    return achieved / jax_peak


@benchmark
def bench_distributed(args: argparse.Namespace) -> float:
    """Episodes/s of the RL step's rollout (experiments.rollout_rate: target_word, --groups groups) on one
    process of one CPU device and on two such processes (experiments.launch_local, 2 shards); the jobs
    alternate --repeats times and each keeps its best. Headline: 2 processes over 1."""
    import subprocess
    import sys

    from experiments.launch_local import with_host_devices

    env = with_host_devices(dict(os.environ), 1)
    rate = ["-m", "experiments.rollout_rate", f"--groups={args.groups}", "--rounds=3"]
    jobs = {1: [sys.executable, *rate, "--shards=1"],
            2: [sys.executable, "-m", "experiments.launch_local", "--processes=2", "--devices=1",
                "--module=experiments.rollout_rate", "--", *rate[2:], "--shards=2"]}
    best: dict[int, dict] = {}
    for _ in range(args.repeats):
        for processes, command in jobs.items():
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            if result["episodes_per_s"] > best.get(processes, {}).get("episodes_per_s", 0.0):
                best[processes] = result
    rows = [("processes", "{}", "processes"), ("episodes", "{}", "episodes"),
            ("best round s", "{:.3f}", "best_s"), ("first round s", "{:.2f}", "first_s"),
            ("episodes/s", "{:.1f}", "episodes_per_s")]
    print(f"\ndistributed: target_word rollout, {args.groups} groups x 4 episodes, 1 CPU device per process, "
          f"{os.cpu_count()} cores; best of {args.repeats} alternating jobs x 3 rounds")
    for label, fmt, key in rows:
        print(f"{label:<15}" + "".join(f"{fmt.format(best[p][key]):>12}" for p in sorted(best)))
    return best[2]["episodes_per_s"] / best[1]["episodes_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--repeats", type=int, default=None,
                        help="warm runs per measurement (the best is kept); default 2, rollout 1")
    parser.add_argument("--models", nargs="+", default=["5m", "smollm2"], choices=["5m", "smollm2"])
    parser.add_argument("--batches", nargs="+", type=int, default=[16, 64], help="sampler batch sizes")
    parser.add_argument("--shapes", nargs="+", default=list(ROLLOUT_SHAPES), choices=list(ROLLOUT_SHAPES),
                        help="rollout: dialogue shapes")
    parser.add_argument("--turns", type=int, default=None,
                        help="rollout: turns the re-prefilling columns play (default: the shape's, fewer "
                        "where QUICK_TURNS says so; the incremental columns play all)")
    parser.add_argument("--full", action="store_true", help="rollout: every shape's full number of turns")
    parser.add_argument("--collapse-configs", nargs="+", default=["default", "quick", "data"],
                        choices=["default", "quick", "data", "scarce"], help="collapse: the configs to run")
    parser.add_argument("--collapse-keep", default=None,
                        help="collapse: keep the run directories in this folder (default: a temporary one)")
    parser.add_argument("--groups", type=int, default=16, help="distributed: scenario groups per rollout")
    parser.add_argument("--mode", default="frozen",
                        help="rl_step: the simulator mode of experiments/configs/target_word.py")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.name == "rollout" else 2)
    ratio = BENCHMARKS[args.name](args)
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
