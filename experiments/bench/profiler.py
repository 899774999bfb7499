"""Where a jitted function's time goes: XLA op times from a profiled call, by kind of op."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator

import jax

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


def print_breakdowns(breakdowns: dict[tuple[str, str], dict[tuple[str, str], float]]) -> None:
    """Print each (model, dtype)'s `op_time_breakdown`, largest part first."""
    print("\nwhere our step's time goes (XLA op time of one profiled step, summed over threads):")
    for (name, dtype), seconds in breakdowns.items():
        total = sum(seconds.values())
        parts = ", ".join(f"{phase} {kind} {s:.2f}s ({s / total:.0%})"
                          for (phase, kind), s in sorted(seconds.items(), key=lambda item: -item[1]))
        print(f"  {name} {dtype}: {parts}")
