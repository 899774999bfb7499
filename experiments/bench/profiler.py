"""Where a jitted function's time goes: XLA op times from a profiled call, by kind of op."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax

from scope_jax.models import cpu_gemm

DECODE_KINDS = (  # (kind, pattern of the jax op name or HLO instruction) in the order they are tried;
    # the head is token-major in the prefill and feature-major (vd,db->vb) in the decode loop
    ("output head", r"\.\.\.d,dv->\.\.\.v|vd,db->vb"),
    ("attention", r"nhqd,nhsd->nhqs|nhsd,nhqd->nhsq|nhqs,nhsd->nhqd"),
    ("layer matmuls", r"dot_general|^dot|ynn"), ("cache writes", r"dynamic.update.slice|scatter"),
    ("sampling", r"argmax|log_softmax|top_k|categorical|reduce_max|exp|sort"),
    ("copies / transposes", r"^copy|^transpose|\bcopy"),
)


def compiled_ops(fn: Callable, *args) -> dict[str, str]:
    """{HLO instruction: jax op name} of jitted `fn` compiled for `args`."""
    return instruction_ops(fn.lower(*args).compile().as_text())


def _instructions(hlo: str) -> Iterator[tuple[str | None, str, str]]:
    """(computation, instruction, the text after "instruction = ") of each instruction of compiled HLO text,
    in order: a computation comes after the ones it calls."""
    computation = None
    for line in hlo.splitlines():
        if header := re.match(r"(?:ENTRY )?%(\S+) .*\{$", line):
            computation = header.group(1)
        elif instruction := re.match(r"\s+(?:ROOT )?%(\S+) = (.*)", line):
            yield computation, *instruction.groups()


def instruction_ops(hlo: str) -> dict[str, str]:
    """{HLO instruction: jax op name} of compiled HLO text, every instruction included. One that XLA made
    without a name (the fusions inside an attention loop, say) takes the name of the instruction that calls
    its computation; one in the entry computation without a name (a zero fill, say) gets ""."""
    own, computation_of, caller = {}, {}, {}
    for computation, name, text in _instructions(hlo):
        computation_of[name] = computation
        if op := re.search(r'op_name="([^"]*)"', text):
            own[name] = op.group(1)
        for called in re.findall(r"(?:calls|to_apply|body|condition)=%([\w.-]+)", text):
            caller.setdefault(called, name)

    def op(name: str) -> str:
        if name not in own:
            calling = caller.get(computation_of[name])
            own[name] = "" if calling is None else op(calling)
        return own[name]

    return {name: op(name) for name in computation_of}


def dot_instructions(hlo: str) -> set[str]:
    """The HLO instructions of compiled HLO text that are a dot, a `cpu_gemm` custom call, or call a
    computation holding one (a fusion of a matmul with the elementwise work or reduction after it is named
    after its root, not the dot)."""
    holds_dot: dict[str, bool] = {}  # per computation
    dots = set()
    for computation, name, text in _instructions(hlo):
        opcode = re.match(r".*?([\w-]+)\(", text)
        called = re.search(r"\bcalls=%([\w.-]+)", text)
        holds = (opcode and (opcode.group(1) == "dot" or any(t in text for t in cpu_gemm.TARGETS.values()))
                 or called and holds_dot.get(called.group(1)))
        if computation and holds:
            dots.add(name)
            holds_dot[computation] = True
    return dots


def op_kind(name: str, op: str) -> str:
    """The DECODE_KINDS kind of HLO instruction `name` with jax op name `op` (else "other")."""
    matches = (kind for kind, pattern in DECODE_KINDS if re.search(pattern, op) or re.search(pattern, name))
    return next(matches, "other")


class ProfiledOp(NamedTuple):
    instruction: str
    op: str  # the jax op name (`instruction_ops`)
    holds_dot: bool  # `dot_instructions`
    start: float  # s, on the trace's clock
    seconds: float


def profiled_ops(fn: Callable, *args) -> list[ProfiledOp]:
    """Each XLA op run by one profiled call of jitted `fn` (while loops left out: their bodies' ops are
    counted)."""
    hlo = fn.lower(*args).compile().as_text()
    ops, dots = instruction_ops(hlo), dot_instructions(hlo)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            jax.block_until_ready(fn(*args))
        with gzip.open(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)[0]) as f:
            events = json.load(f)["traceEvents"]
    ran = [e for e in events if e.get("ph") == "X" and e.get("name") in ops
           and not e["name"].startswith("while")]
    return [ProfiledOp(e["name"], ops[e["name"]], e["name"] in dots, e["ts"] / 1e6, e["dur"] / 1e6)
            for e in ran]


def idle_seconds(ops: list[ProfiledOp]) -> tuple[float, float]:
    """(the span from the first op's start to the last one's end, the time within it when no op ran)."""
    busy, covered_to = 0.0, -math.inf
    for op in sorted(ops, key=lambda op: op.start):
        end = op.start + op.seconds
        if end > covered_to:
            busy += end - max(op.start, covered_to)
            covered_to = end
    span = max(op.start + op.seconds for op in ops) - min(op.start for op in ops)
    return span, span - busy


def op_seconds(fn: Callable, *args) -> collections.Counter:
    """XLA op seconds of one profiled call of jitted `fn`, by DECODE_KINDS (else "other")."""
    seconds = collections.Counter()
    for op in profiled_ops(fn, *args):
        seconds[op_kind(op.instruction, op.op)] += op.seconds
    return seconds


class Breakdown(NamedTuple):
    seconds: dict[tuple[str, str], float]  # XLA op time by (phase, kind), summed over threads
    span: float  # s from the first op's start to the last one's end
    idle: float  # s of the span in which no op ran


def op_time_breakdown(fn: Callable, *args) -> Breakdown:
    """XLA op time by (phase, kind) in one profiled call of jitted `fn`, and the time no op ran.

    Phases: "backward" (jax's transpose of a jvp), "forward", "unnamed" (ops XLA made outside any jax op:
    zero fills, copies). Kinds: "matmul" (dots, and fusions holding one), "transpose/copy" (layout changes,
    often fused with elementwise work), "other" (elementwise, reductions, slicing). Op times of parallel
    threads add up, so they can exceed the wall time. XLA:CPU runs an Eigen dot (a weight gradient that
    contracts the tokens axis of both operands, say) outside its op event, which only dispatches it: its
    time is in `idle`, with any gaps between ops.
    """
    ops = profiled_ops(fn, *args)
    seconds = collections.Counter()
    for op in ops:
        phase = "backward" if "transpose(jvp" in op.op else "forward" if op.op else "unnamed"
        if op.holds_dot:
            kind = "matmul"
        elif "transpose" in op.instruction or "copy" in op.instruction:
            kind = "transpose/copy"
        else:
            kind = "other"
        seconds[(phase, kind)] += op.seconds
    return Breakdown(dict(seconds), *idle_seconds(ops))


def print_breakdowns(breakdowns: dict[tuple[str, str], Breakdown]) -> None:
    """Print each (model, dtype)'s `op_time_breakdown`, largest part first."""
    print("\nwhere our step's time goes (XLA op time of one profiled step, summed over threads; then the "
          "time no op ran, which holds the work of the Eigen dots their op events only dispatch):")
    for (name, dtype), breakdown in breakdowns.items():
        total = sum(breakdown.seconds.values())
        largest_first = sorted(breakdown.seconds.items(), key=lambda item: -item[1])
        parts = ", ".join(f"{phase} {kind} {s:.2f}s ({s / total:.0%})" for (phase, kind), s in largest_first)
        print(f"  {name} {dtype}: {parts}; no op ran for {breakdown.idle:.2f}s of the ops' "
              f"{breakdown.span:.2f}s")
