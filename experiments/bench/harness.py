"""The timing harness every benchmark shares: best-of alternating warm runs, the benchmark models, the
measured float32 matmul peak, model FLOPs, tables, and the header that says where a run was made."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx

from scope_jax.models import Decoder, ModelConfig, from_pretrained, init, split

# A Llama-type model of about 5M parameters (random weights).
SMALL = ModelConfig(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5)
SMOLLM2 = "smollm2-135m-instruct"
MODEL_NAMES = ("5m", "smollm2")


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(seconds of the first call, best seconds of `repeats` further calls); fn must block until done."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    return first, best_of({"fn": fn}, repeats)["fn"]


def best_of(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best seconds of each warm (already compiled) function over `repeats` rounds that alternate them."""
    return best_runs(fns, repeats, in_a_row=1)[0]


def best_runs(fns: dict[str, Callable[[], Any]], repeats: int, in_a_row: int) -> list[dict[str, float]]:
    """Over `repeats` rounds that alternate the warm functions, each running `in_a_row` times in a row per
    round: for each place in the row, each function's best seconds there ([best first runs, best second
    runs, ...]). A step's later runs in a row follow itself, as in a training loop; its first follows
    another side's."""
    best = [dict.fromkeys(fns, float("inf")) for _ in range(in_a_row)]
    for _ in range(repeats):
        for name, fn in fns.items():
            for place in best:
                start = time.perf_counter()
                fn()
                place[name] = min(place[name], time.perf_counter() - start)
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


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # the compute dtypes a benchmark can run


def compute_graphdef(config: ModelConfig, dtype: str) -> nnx.GraphDef:
    """The graphdef of a decoder that computes in `dtype` (activations and matmul inputs) from float32
    parameters: mixed precision with float32 master weights when dtype is "bfloat16"."""
    return split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), dtype=DTYPES[dtype],
                                                param_dtype=jnp.float32)))[0]


def token_batch(config: ModelConfig, batch: int, length: int, skipped: int) -> tuple[np.ndarray, np.ndarray]:
    """Random tokens [batch, length] (seed 0) and a float32 loss mask that skips the first `skipped`
    positions of each row."""
    tokens = np.random.RandomState(0).randint(1, config.vocab_size, (batch, length))
    mask = np.ones((batch, length), np.float32)
    mask[:, :skipped] = 0.0
    return tokens, mask


def add_float32_drift(rows: list[dict[str, Any]], model: str, losses: dict[str, tuple[float, ...]],
                      keys: tuple[str, ...]) -> None:
    """Set `keys` (one per side) of `model`'s rows to each side's |loss - its float32 loss| (`losses`:
    dtype -> one loss per side; nan without a float32 column)."""
    float32 = losses.get("float32", (float("nan"),) * len(keys))
    for row in rows:
        if row["model"] == model:
            row.update({key: abs(a - b) for key, a, b in zip(keys, losses[row["dtype"]], float32)})


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


def train_flops(config: ModelConfig, batch: int, length: int, weight_gradients: bool = True) -> float:
    """Model FLOPs of one forward + backward: 6 N T + 12 layers B L^2 heads head_dim.

    N counts the matmul parameters (every layer's projections and the output head, not the embedding
    lookup), T = B L tokens; the second term is the two attention matmuls (QK^T and AV, dense over the
    causal square) times 3 for forward + backward. Without weight gradients (a frozen base under LoRA,
    whose adapters' FLOPs are not counted) the first term is 4 N T. Recomputation (remat, the chunked
    head) is not counted.
    """
    c = config
    layer = c.num_layers * (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
                            + 3 * c.hidden_size * c.intermediate_size)
    head = c.hidden_size * c.vocab_size
    attention = 12 * c.num_layers * batch * length**2 * c.num_heads * c.head_dim
    return (6 if weight_gradients else 4) * (layer + head) * batch * length + attention


def print_table(rows: list[dict[str, Any]], spec: tuple[tuple[str, str, str], ...]) -> None:
    """Rows (dicts) as aligned columns, one per (label, key, format) of `spec`, separated by a space."""
    widths = [max(len(label), len(fmt.format(row[key]))) for row in rows[:1] for label, key, fmt in spec]
    print(" ".join(f"{label:>{w}}" if ">" in fmt else f"{label:<{w}}"
                   for (label, _, fmt), w in zip(spec, widths)))
    for row in rows:
        print(" ".join(f"{fmt.format(row[key]):>{w}}" if ">" in fmt else f"{fmt.format(row[key]):<{w}}"
                       for (_, key, fmt), w in zip(spec, widths)))


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        return {"Model name": f"unknown (lscpu: {err})"}
    return dict(line.split(":", 1) for line in out.splitlines() if ":" in line)


def _commit() -> str:
    git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    return commit + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no")
                     else "")


TIMING_ENVIRONMENT = ("XLA_FLAGS", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_",
                      "MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "JAX_PLATFORMS")


NATIVE_BFLOAT16 = ("avx512_bf16", "amx_bf16")  # lscpu flags of the CPUs with bfloat16 matmul instructions


def bfloat16_note(dtypes: list[str]) -> str | None:
    """The line to print before a run with a bfloat16 column on a CPU whose lscpu flags hold none of
    NATIVE_BFLOAT16: PyTorch's autocast reference then runs a slow path that can take most of the run
    (docs/models.md). None otherwise, or when lscpu gives no flags."""
    flags = _lscpu().get("Flags")
    if "bfloat16" not in dtypes or flags is None or set(flags.split()) & set(NATIVE_BFLOAT16):
        return None
    return ("note: this CPU has neither avx512_bf16 nor amx_bf16, so PyTorch's bfloat16 reference may run "
            "on one core for many times its float32 time (docs/models.md); --dtypes float32 leaves the "
            "bfloat16 column out")


def header() -> list[str]:
    """Where and when a run is made: the command, the time, the commit, the machine (lscpu model and
    flags, cores), the environment variables among TIMING_ENVIRONMENT that are set (each changes the
    timings), and the load average just before the run (a timing under load measures the load too)."""
    cpu = {key.strip(): value.strip() for key, value in _lscpu().items()}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"command: python -m experiments.bench {' '.join(sys.argv[1:])}",
            f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"commit: {_commit()}",
            f"machine: {cpu.get('Model name', 'unknown')}, {os.cpu_count()} CPUs; jax {jax.__version__}",
            f"cpu flags: {cpu.get('Flags', 'unknown')}",
            "environment: " + (" ".join(f"{name}={os.environ[name]}" for name in TIMING_ENVIRONMENT
                                        if name in os.environ) or f"none of {', '.join(TIMING_ENVIRONMENT)}"),
            f"load average before the run (1, 5, 15 min): {load}"]
