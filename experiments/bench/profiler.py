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
from typing import NamedTuple

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
    return instruction_ops(fn.lower(*args).compile().as_text())


def instruction_ops(hlo: str) -> dict[str, str]:
    """{HLO instruction: jax op name} of compiled HLO text."""
    instruction = r"^\s+(?:ROOT )?%(\S+) = .*?op_name=\"([^\"]*)\""
    return {m.group(1): m.group(2) for m in re.finditer(instruction, hlo, re.M)}


def dot_instructions(hlo: str) -> set[str]:
    """The HLO instructions of compiled HLO text that are a dot or call a computation holding one (a fusion
    of a matmul with the elementwise work or reduction after it is named after its root, not the dot)."""
    holds_dot: dict[str, bool] = {}  # per computation; a computation comes after the ones it calls
    dots, computation = set(), None
    for line in hlo.splitlines():
        if header := re.match(r"(?:ENTRY )?%(\S+) .*\{$", line):
            computation = header.group(1)
            holds_dot[computation] = False
        elif (instruction := re.match(r"\s+(?:ROOT )?%(\S+) = .*?([\w-]+)\((.*)", line)) and computation:
            name, opcode, rest = instruction.groups()
            called = re.search(r"\bcalls=%([\w.-]+)", rest)
            if opcode == "dot" or (called and holds_dot.get(called.group(1))):
                dots.add(name)
                holds_dot[computation] = True
    return dots


def op_kind(name: str, op: str) -> str:
    """The DECODE_KINDS kind of HLO instruction `name` with jax op name `op` (else "other")."""
    matches = (kind for kind, pattern in DECODE_KINDS if re.search(pattern, op) or re.search(pattern, name))
    return next(matches, "other")


class ProfiledOp(NamedTuple):
    instruction: str
    op: str  # the jax op name
    holds_dot: bool  # `dot_instructions`
    seconds: float


def profiled_ops(fn: Callable, *args) -> Iterator[ProfiledOp]:
    """Each XLA op run by one profiled call of jitted `fn` (while loops left out: their bodies' ops are
    counted)."""
    hlo = fn.lower(*args).compile().as_text()
    ops, dots = instruction_ops(hlo), dot_instructions(hlo)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            jax.block_until_ready(fn(*args))
        with gzip.open(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)[0]) as f:
            events = json.load(f)["traceEvents"]
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and name in ops and not name.startswith("while"):
            yield ProfiledOp(name, ops[name], name in dots, event["dur"] / 1e6)


def op_seconds(fn: Callable, *args) -> collections.Counter:
    """XLA op seconds of one profiled call of jitted `fn`, by DECODE_KINDS (else "other")."""
    seconds = collections.Counter()
    for op in profiled_ops(fn, *args):
        seconds[op_kind(op.instruction, op.op)] += op.seconds
    return seconds


def op_time_breakdown(fn: Callable, *args) -> dict[tuple[str, str], float]:
    """Seconds of XLA op time by (forward / backward, kind) in one profiled call of jitted `fn`.

    Kinds: "matmul" (dots, and fusions holding one), "transpose/copy" (layout changes, often fused with
    elementwise work), "other" (elementwise, reductions, slicing). Op times of parallel threads add up, so
    the total can exceed the wall time.
    """
    seconds = collections.Counter()
    for op in profiled_ops(fn, *args):
        phase = "backward" if "transpose(jvp" in op.op else "forward"
        if op.holds_dot:
            kind = "matmul"
        elif "transpose" in op.instruction or "copy" in op.instruction:
            kind = "transpose/copy"
        else:
            kind = "other"
        seconds[(phase, kind)] += op.seconds
    return dict(seconds)


def print_breakdowns(breakdowns: dict[tuple[str, str], dict[tuple[str, str], float]]) -> None:
    """Print each (model, dtype)'s `op_time_breakdown`, largest part first."""
    print("\nwhere our step's time goes (XLA op time of one profiled step, summed over threads):")
    for (name, dtype), seconds in breakdowns.items():
        total = sum(seconds.values())
        parts = ", ".join(f"{phase} {kind} {s:.2f}s ({s / total:.0%})"
                          for (phase, kind), s in sorted(seconds.items(), key=lambda item: -item[1]))
        print(f"  {name} {dtype}: {parts}")
