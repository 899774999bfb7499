"""Test driver: a few RL steps of experiments/configs/target_word.py, writing each step's global batch and
metrics to --out (from process 0). Run alone, or as each process of experiments.launch_local --module.

    python -m tests.training.distributed_steps --out=DIR [--mode=frozen] [--steps=3] [--distributed]
"""

import argparse
import json
import pathlib
import runpy

import jax
import numpy as np
from jax.experimental import multihost_utils

from scope_jax import distributed, sharding
from scope_jax.training import rl_step
from scope_jax.training.setup import build
from scope_jax.training.state import state_shardings

SHARDS = 2
# Replies this long make the views straddle role_batch's 64-token multiple: in some step one process's rows
# pad to 64 and the other's to 128, which the length the processes agree on must reconcile.
MAX_NEW_TOKENS = 15


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", default="frozen")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--distributed", action="store_true")
    args = parser.parse_args()
    if args.distributed:
        distributed.initialize()
    config = runpy.run_path("experiments/configs/target_word.py")["get_config"](args.mode)
    config.mesh.data, config.rollout.shards, config.sampling.max_new_tokens = -1, SHARDS, MAX_NEW_TOKENS
    setup = build(config)
    state = sharding.place(setup.state, state_shardings(setup.state, setup.mesh))
    out, batches, metrics = pathlib.Path(args.out), {}, []
    for step in range(args.steps):
        mine = rl_step.play_episodes(setup, state, step)  # the rollout rl_step plays next, played again
        batch = rl_step.make_batch(setup, mine, rl_step.role_advantages(setup, mine), step)
        for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
            batches[f"{step}/{sharding.path_string(path)}"] = np.asarray(
                multihost_utils.process_allgather(leaf, tiled=True))
        state, step_metrics, _ = rl_step.rl_step(setup, state, step)
        metrics.append({k: v for k, v in step_metrics.items() if not k.startswith("time/")
                        and k != "tokens_per_s"})
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "batches.npz", **batches)
        (out / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
