"""collapse: the collapse testbed end to end (`experiments.run`, fresh run directories), default, quick and data
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

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from experiments.bench.harness import print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--collapse-configs", nargs="+", default=["default", "quick", "data"],
                        choices=["default", "quick", "data", "scarce"], help="the configs to run")
    parser.add_argument("--collapse-keep", default=None,
                        help="keep the run directories in this folder (default: a temporary one)")


COLLAPSE_TABLE = (  # (label, key, format) of each column of the collapse table
    ("config", "config", "{:<8}"), ("wall s", "wall", "{:>7.0f}"), ("CPU s", "cpu", "{:>7.0f}"),
    ("load 1m", "load", "{:>10}"), ("budget", "budget", "{:>6.0f}"), ("wall/budget", "ratio", "{:>11.0%}"),
)


def run(args: argparse.Namespace) -> float:
    from scope_jax.testbed import arm_store, experiment

    budgets = {"default": 600.0, "quick": 120.0, "data": 1200.0, "scarce": 1800.0}
    measured = {}
    child_cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
    with contextlib.ExitStack() as stack:
        folder = args.collapse_keep or stack.enter_context(tempfile.TemporaryDirectory())
        for name in args.collapse_configs:
            spec = "experiments/configs/collapse.py" + ("" if name == "default" else f":{name}")
            if name == "data" and "default" in measured:
                for part in (experiment.PRETRAINED, *(f"{arm_store.ARMS_DIR}/{arm}.msgpack"
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
