"""Test driver: after `scope_jax.distributed.initialize`, process 1 sleeps --late seconds before the first
collective of the job; every process then prints what the all-gather gave it. Run as each process of
experiments.launch_local --module."""

import argparse
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

from scope_jax import distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--late", type=float, required=True)
    parser.add_argument("--distributed", action="store_true", required=True)  # set by the launcher
    args = parser.parse_args()
    distributed.initialize()
    if jax.process_index() == 1:
        time.sleep(args.late)
    gathered = multihost_utils.process_allgather(jnp.full((2,), jax.process_index()))
    print(f"process {jax.process_index()} gathered {gathered.tolist()}", flush=True)


if __name__ == "__main__":
    main()
