"""Start a multi-process job on this machine: python -m experiments.launch_local --processes N -- RUN_ARGS.

Each of the N processes runs `python -m experiments.run RUN_ARGS --distributed` (`--module` names another
module that takes --distributed) with the coordinator on
127.0.0.1 at a free port, its process id, and (on the CPU) `--devices` host devices of its own; together
they form one global mesh of N x devices devices (scope_jax.distributed). For tests and single-node users;
a cluster starts its processes with its own launcher (experiments/launch/).

The launcher exits with the first failing process's status. A process killed by a signal, or one that
fails while the others have not ended by themselves `--grace` seconds later, is lost: the launcher prints
one line naming it, stops the others (SIGTERM, then SIGKILL after `--grace` seconds) and exits with
status 1, so a lost process never leaves the rest hanging in a collective. A process killed by a signal
is the one named even when another failed first (its collective lost the killed one). (A refused config
fails on every process at once: process 0 prints its one line, and the launcher adds none.)
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import time

from scope_jax.distributed import COORDINATOR, PROCESS_ID, PROCESSES

POLL_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_host_devices(env: dict[str, str], devices: int) -> dict[str, str]:
    """`env` with XLA_FLAGS asking for `devices` host (CPU) devices, replacing any other count there."""
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    return {**env, "XLA_FLAGS": " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])}


def process_env(base: dict[str, str], coordinator: str, processes: int, process: int,
                devices: int) -> dict[str, str]:
    """`base` with the launcher's variables and this process's host device count."""
    return with_host_devices({**base, COORDINATOR: coordinator, PROCESSES: str(processes),
                              PROCESS_ID: str(process)}, devices)


def exit_reason(status: int) -> str:
    return f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"


def launch(processes: int, devices: int, run_args: list[str], grace: float,
           module: str = "experiments.run") -> int:
    """Run the job; its exit status."""
    coordinator = f"127.0.0.1:{free_port()}"
    args = [sys.executable, "-m", module, *run_args]
    if "--distributed" not in run_args:
        args.append("--distributed")
    children = [subprocess.Popen(args, env=process_env(dict(os.environ), coordinator, processes, i, devices))
                for i in range(processes)]
    try:
        failed, since = None, 0.0
        while True:
            statuses = [child.poll() for child in children]
            if failed is None:
                failed = next((i for i, s in enumerate(statuses) if s not in (None, 0)), None)
                since = time.time()
            # a killed process is the lost one, even where another failed first (in a collective with it)
            killed = next((i for i, s in enumerate(statuses) if s is not None and s < 0), None)
            ended = None not in statuses
            if killed is not None or (failed is not None and not ended and time.time() - since > grace):
                lost = failed if killed is None else killed
                # on a line of its own: a progress bar may have left the cursor mid-line
                print(f"\nerror: process {lost} of {processes} {exit_reason(statuses[lost])}; "
                      "stopping the others", file=sys.stderr, flush=True)
                stop(children, grace)
                return 1
            if ended:
                return 0 if failed is None else statuses[failed]
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop(children, grace)
        return 130


def stop(children: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM the children still running, SIGKILL those still there after `grace` seconds."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.time() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):
        sys.exit(f"error: {message}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("error: usage: python -m experiments.launch_local --processes N [--devices K] -- RUN_ARGS")
    split = argv.index("--")
    parser = _OneLineErrors(prog="python -m experiments.launch_local")
    parser.add_argument("--processes", type=int, required=True, help="processes to start")
    parser.add_argument("--devices", type=int, default=1, help="host (CPU) devices per process")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds the others get to end by themselves after one fails, then to stop")
    parser.add_argument("--module", default="experiments.run", help="the module each process runs")
    options = parser.parse_args(argv[:split])
    if options.processes < 1 or options.devices < 1:
        sys.exit("error: --processes and --devices must be at least 1")
    if not 0 <= options.grace < math.inf:
        sys.exit(f"error: --grace is {options.grace}; it must be a finite number of seconds, at least 0")
    return launch(options.processes, options.devices, argv[split + 1:], options.grace, options.module)


if __name__ == "__main__":
    sys.exit(main())
