"""The accelerator check: bfloat16 benchmarks on Qwen3-0.6B- and 1.7B-shaped random weights.

    python -m experiments.gpu_check [--models 0.6b 1.7b] [--repeats N] [--dry-run]

Run by experiments/launch/gpu_check.sh after the GPU tests. For each model: the sampler (greedy, prompt
512, 128 new tokens, batch 16 and 64), the multi-turn rollout (the p4g and tau2 shapes of
`experiments.bench rollout`, batch 16: per-row KV caches kept across turns against re-prefilling every
turn) and the train step (value_and_grad of the token log-prob loss over 8 x 2,048 tokens, every layer
rematerialised). Each prints tokens/s, MFU (model FLOPs per second over the device's bfloat16 peak: its
datasheet value when the device is known, else a measured matmul) and device memory (the allocator's peak
so far, where the platform reports it). Rows print as they finish, so a run cut short keeps what it
measured. --dry-run: tiny shapes of the same architecture on the CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.dialogues import ROLLOUT_SHAPES, RolloutShape, SyntheticDialogue, ours_rollout_columns
from experiments.bench.harness import best_of, timed, train_flops
from experiments.configs.p4g_qwen3 import ARCHITECTURES
from scope_jax.logprobs import token_logprobs
from scope_jax.models import ModelConfig, init
from scope_jax.sampling import SamplingConfig, generate

# Dense bfloat16 peak FLOP/s from the vendors' datasheets, by a substring of jax's device_kind.
DATASHEET_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
                   "A10G": 70e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12,
                   "TPU v6": 918e12}
TINY = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The measured shapes: sampler (batches, prompt, new tokens), rollout (batch, shapes, turns: None =
    the shape's own) and train step (batch, length)."""

    sampler_batches: tuple[int, ...] = (16, 64)
    prompt: int = 512
    new_tokens: int = 128
    rollout_rows: int = 16
    rollout_shapes: tuple[tuple[str, RolloutShape], ...] = tuple(ROLLOUT_SHAPES.items())
    turns: int | None = None
    train_batch: int = 8
    train_length: int = 2048


DRY_RUN = Sizes(sampler_batches=(2,), prompt=16, new_tokens=8, rollout_rows=4,
                rollout_shapes=(("p4g", RolloutShape(turns=2, message=8, prompt=32)),), train_batch=2,
                train_length=64)


def peak_flops(device: jax.Device, dry_run: bool) -> tuple[float, str]:
    """(bfloat16 FLOP/s, where the number comes from): the datasheet's for a known device, else a
    measured 8192^2 (dry run: 512^2) bfloat16 matmul."""
    for kind, flops in DATASHEET_PEAKS.items():
        if kind in device.device_kind:
            return flops, f"datasheet, {device.device_kind}"
    size = 512 if dry_run else 8192
    a = jnp.ones((size, size), jnp.bfloat16)
    dot = jax.jit(jnp.dot)
    seconds = timed(lambda: dot(a, a).block_until_ready(), 3)[1]
    return 2 * size**3 / seconds, f"measured {size}^2 matmul, {device.device_kind}"


def memory_gib(device: jax.Device) -> str:
    """The device allocator's peak bytes in use so far, in GiB ('n/a' where the platform has no stats)."""
    stats = device.memory_stats() or {}
    return f"{stats['peak_bytes_in_use'] / 2**30:.1f}" if "peak_bytes_in_use" in stats else "n/a"


def report(line: str) -> None:
    print(line, flush=True)


def check_sampler(name: str, arch: ModelConfig, graphdef, params, sizes: Sizes, peak: float, repeats: int,
                  device: jax.Device) -> None:
    for batch in sizes.sampler_batches:
        rng = np.random.RandomState(batch)
        prompts = rng.randint(1, arch.vocab_size, (batch, sizes.prompt)).astype(np.int32)

        def run(new: int) -> Any:
            config = SamplingConfig(temperature=0.0, max_new_tokens=new)
            return jax.block_until_ready(generate(graphdef, params, prompts, np.full(batch, sizes.prompt),
                                                  jax.random.key(0), config))

        first, _ = timed(lambda: run(sizes.new_tokens), 0)
        run(1)
        best = best_of({"all": lambda: run(sizes.new_tokens), "prefill": lambda: run(1)}, repeats)
        step = (best["all"] - best["prefill"]) / (sizes.new_tokens - 1)
        prefill_mfu = train_flops(arch, batch, sizes.prompt) / 3 / best["prefill"] / peak
        decode_mfu = train_flops(arch, batch, 1) / 3 / step / peak
        report(f"sampler   {name} batch {batch}: {batch * sizes.new_tokens / best['all']:.0f} tok/s; "
               f"prefill {best['prefill'] * 1e3:.1f} ms (MFU {prefill_mfu:.1%}), decode step "
               f"{step * 1e3:.2f} ms (MFU {decode_mfu:.2%}); compile {first - best['all']:.1f} s; "
               f"peak memory {memory_gib(device)} GiB")


def check_rollout(name: str, arch: ModelConfig, graphdef, params, sizes: Sizes, peak: float, repeats: int,
                  device: jax.Device) -> None:
    rows = sizes.rollout_rows
    for shape_name, shape in sizes.rollout_shapes:
        turns = sizes.turns or shape.turns
        dialogue = SyntheticDialogue.make(shape, turns, rows, arch.vocab_size)
        columns = ours_rollout_columns(graphdef, params, dialogue)
        first = {column: timed(play, 0)[0] for column, play in columns.items()}
        best = best_of(columns, repeats)
        generated = rows * turns * shape.message
        cached, again = best["ours, cached"], best["ours, re-prefilling"]
        compiles = " / ".join(f"{first[column] - best[column]:.1f} s" for column in columns)
        report(f"rollout   {name} {shape_name} ({turns} turns, batch {rows}): cached {cached:.2f} s "
               f"({generated / cached:.0f} tok/s), re-prefilling {again:.2f} s "
               f"({generated / again:.0f} tok/s): {again / cached:.2f}x; compile {compiles}; "
               f"peak memory {memory_gib(device)} GiB")


def check_train_step(name: str, arch: ModelConfig, sizes: Sizes, peak: float, repeats: int,
                     device: jax.Device) -> None:
    batch, length = sizes.train_batch, sizes.train_length
    graphdef, params = init(arch, seed=0, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=True)
    tokens = jnp.asarray(np.random.RandomState(0).randint(1, arch.vocab_size, (batch, length)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))

    def loss(params):
        return -jnp.mean(token_logprobs(graphdef, params, tokens, positions).logprobs[:, 1:])

    start = time.perf_counter()
    step = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
    compile_seconds = time.perf_counter() - start
    temp = step.memory_analysis().temp_size_in_bytes
    _, seconds = timed(lambda: jax.block_until_ready(step(params)), repeats)
    mfu = train_flops(arch, batch, length) / seconds / peak
    report(f"train     {name} {batch} x {length}: {batch * length / seconds:.0f} tok/s, "
           f"step {seconds * 1e3:.0f} ms, MFU {mfu:.1%} (6 N T + attention, remat not counted); "
           f"compile {compile_seconds:.1f} s; scratch {temp / 2**30:.2f} GiB; "
           f"peak memory {memory_gib(device)} GiB")


def attempt(check: Callable[..., None], *args: Any) -> list[str]:
    """Run one check; a failure is reported in one line and returned, so the checks after it still run
    (a leased accelerator's minutes are not spent twice)."""
    try:
        check(*args)
        return []
    except Exception as e:  # noqa: BLE001  (any failure of one check; the run goes on and exits non-zero)
        line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        report(f"FAILED    {line}")
        return [line]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["0.6b", "1.7b"], choices=sorted(ARCHITECTURES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args(argv)
    if args.dry_run:
        jax.config.update("jax_platforms", "cpu")
    device = jax.devices()[0]
    if not args.dry_run and device.platform == "cpu":
        raise SystemExit("gpu_check: no accelerator found (jax.devices() is CPU); --dry-run tests the script")
    peak, source = peak_flops(device, args.dry_run)
    sizes = DRY_RUN if args.dry_run else Sizes()
    report(f"device: {device.device_kind} ({device.platform}, {jax.device_count()} device(s)); bfloat16 peak "
           f"{peak / 1e12:.1f} TFLOP/s ({source})")
    failed = []
    for name in args.models:
        arch = TINY if args.dry_run else ARCHITECTURES[name]
        label = f"Qwen3-{name.upper()}" + (" (tiny, dry run)" if args.dry_run else "")
        graphdef, params = init(arch, seed=0, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
        for check in (check_sampler, check_rollout):
            failed += attempt(check, label, arch, graphdef, params, sizes, peak, args.repeats, device)
        del params
        failed += attempt(check_train_step, label, arch, sizes, peak, args.repeats, device)
    if failed:
        raise SystemExit(f"gpu_check: {len(failed)} check(s) failed: {'; '.join(failed)}")
    report("gpu_check: done")


if __name__ == "__main__":
    main()
