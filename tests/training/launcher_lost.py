"""Test driver for experiments.launch_local: process 0 fails at once, as a process whose collective lost
its peer does; process 1 is killed by SIGKILL a moment later. Imports no JAX."""

import os
import signal
import sys
import time

from scope_jax.distributed import PROCESS_ID

if __name__ == "__main__":
    if os.environ[PROCESS_ID] == "0":
        sys.exit(1)
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
