"""distributed: episodes/s of the RL step's rollout on 1 and on 2 processes of one CPU device each
(experiments.launch_local; the 2-process job shares the groups out in 2 shards): ratio=<2/1>.
The jobs alternate --repeats times and each keeps its best."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from experiments.launch_local import with_host_devices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--groups", type=int, default=16, help="scenario groups per rollout")


def run(args: argparse.Namespace) -> float:
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
