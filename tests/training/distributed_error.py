"""Test driver: after `scope_jax.distributed.initialize`, process 1 meets an error (`--error=user`: a user's
mistake, as experiments.run reports one; `--error=bug`: an exception nothing catches) while process 0 waits
in a collective; or (`--error=config`) every process meets the same error, process 1 some seconds after
process 0. Run as each process of experiments.launch_local --module."""

import argparse
import time

import jax
from jax.experimental import multihost_utils

from scope_jax import distributed

MESSAGE = "the dialogue the agent already saw changed"
LATE_S = 5  # process 1 reaches the shared error this long after process 0 (a slower import, say)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--error", choices=("user", "bug", "config"), required=True)
    parser.add_argument("--distributed", action="store_true", required=True)  # set by the launcher
    args = parser.parse_args()
    distributed.initialize()
    if args.error == "config":
        time.sleep(LATE_S * jax.process_index())
        distributed.exit_with_error(MESSAGE, on_every_process=True)
    if jax.process_index() == 1:
        if args.error == "user":
            distributed.exit_with_error(MESSAGE)
        raise RuntimeError(MESSAGE)
    multihost_utils.sync_global_devices("never met by process 1")


if __name__ == "__main__":
    main()
