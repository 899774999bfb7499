"""rollout: multi-turn greedy rollouts at the sampler level, batch 16, on synthetic dialogues (a shared system
prompt, then per turn a fixed random 'other side' message and template tokens, and the model's own reply
of `message` tokens, no early stop; the same inputs for every column): ours with per-row KV caches kept
across turns and a shared prefix (`scope_jax.kv_cache`), ours re-prefilling every view
(`scope_jax.sampling.generate`), transformers `generate` per turn on the whole history, and transformers
carrying its `past_key_values` (DynamicCache) across turns. Shapes: p4g (10 turns, 40-token messages,
512-token prompt) and tau2 (20 turns, 40-token messages, 4,096-token prompt). Generated tokens/s, wall
time, and the peak resident memory each column adds (peak RSS above the RSS before it, the weights
already loaded). The re-prefilling columns play the first --turns turns (default: all, fewer where
QUICK_TURNS says so; --full: all), the two incremental ones every turn; where the former stop early, a
second table gives each column's time over the whole dialogue: measured for the incremental columns, a
lower bound for the others (each unplayed turn re-prefills a longer history than any played one, so
takes at least the fastest played turn's time). Headline: ours cached over transformers re-prefilling,
SmolLM2, p4g shape."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments.bench.dialogues import (ROLLOUT_SHAPES, TEMPLATE_TOKENS, Played, PlayFn, SyntheticDialogue,
                                         ours_rollout_columns, reprefilled_reply, reprefilling_compiles)
from experiments.bench.harness import models, print_table, timed
from experiments.bench.references import torch_model, torch_threads
from scope_jax.sampling import SamplingConfig

# Turns the re-prefilling columns play by default where all of them take hours on a 2-core CPU (--full: all).
QUICK_TURNS = {("SmolLM2-135M", "tau2"): 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", nargs="+", default=list(ROLLOUT_SHAPES), choices=list(ROLLOUT_SHAPES),
                        help="dialogue shapes")
    parser.add_argument("--turns", type=int, default=None,
                        help="turns the re-prefilling columns play (default: the shape's, fewer where "
                        "QUICK_TURNS says so; the incremental columns play all)")
    parser.add_argument("--full", action="store_true", help="every shape's full number of turns")


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


def run(args: argparse.Namespace) -> float:
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
