"""Episodes per second of the RL step's rollout, on one process or as each process of a multi-process job
(`bench distributed` starts it through experiments.launch_local):

    python -m experiments.rollout_rate --groups G --shards S --rounds R [--distributed]

Plays the train rollout of experiments/configs/target_word.py (G scenario groups in S shards, shared by
the processes) once to compile, then R times; every process waits for the others before and after each
round, and process 0 prints one JSON line: {"episodes_per_s": best round's episodes / its seconds, ...}.
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from experiments.configs.target_word import get_config
from scope_jax import distributed, sharding
from scope_jax.training import rl_step
from scope_jax.training.setup import build
from scope_jax.training.state import state_shardings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--distributed", action="store_true")
    args = parser.parse_args()
    if args.distributed:
        distributed.initialize()
    config = get_config()
    config.rollout.groups, config.rollout.shards, config.mesh.data = args.groups, args.shards, -1
    setup = build(config)
    state = sharding.place(setup.state, state_shardings(setup.state, setup.mesh))
    roles = rl_step.speakers(setup, state.params)

    def round_seconds(step: int) -> float:
        distributed.gather(None)  # every process starts together
        start = time.perf_counter()
        rl_step.play_episodes(setup, state, step, roles)
        distributed.gather(None)  # and the round ends when the last one is done
        return time.perf_counter() - start

    compile_s = round_seconds(0)
    best = min(round_seconds(step) for step in range(1, args.rounds + 1))
    if jax.process_index() == 0:
        episodes = config.rollout.groups * config.rollout.group_size
        print(json.dumps({"episodes_per_s": episodes / best, "episodes": episodes, "best_s": best,
                          "first_s": compile_s, "processes": jax.process_count()}))


if __name__ == "__main__":
    main()
