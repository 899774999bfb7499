"""The sandbox: every test run is a subprocess with hard limits, in a throwaway work directory.

Each run gets
- a wall-clock limit: at the limit (or when it floods its output) its whole process group is killed;
- resource limits set in the child before it execs (`preexec_fn`): CPU seconds, address space, number of
  processes, size of any file written, open files, no core dumps;
- a scrubbed environment: HOME and TMPDIR inside the work directory, no proxy variables, no bytecode
  files, a fixed hash seed, git confined to the work directory;
- capped output: stdout and stderr together are read as they come and only the first and last
  `output_bytes / 2` bytes are kept; a run that writes more than `max_output_bytes` is killed;
- one of two isolation levels:
  "namespaces"  `unshare` runs the command in new mount, network and pid namespaces: no network (only a
                loopback device, down), every mount except the work directory remounted read-only, and
                every process the command starts dies with it (the command is the namespace's init,
                which dies with `unshare --kill-child`);
  "process"     no namespaces (no `unshare`, or it is not permitted here): the network is blocked only for
                Python code (a `sitecustomize` on PYTHONPATH makes `socket.socket` refuse INET and INET6
                sockets), writes outside the work directory are not blocked, and a process that leaves
                the process group (setsid) survives the kill.
  "auto" (the default) takes "namespaces" when a probe run in them succeeds, else "process".

RLIMIT_NPROC counts all processes of the user, so it is set to the user's current count plus `processes`;
the kernel does not apply it to root at all. docs/cooperbench.md lists what is and is not contained.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "namespaces", "process")

# Run inside the new namespaces as `sh -c JAIL jail WORKDIR COMMAND...`: keep WORKDIR writable (a bind
# mount of its own), make every other mount read-only, then exec the command (which becomes pid 1) from
# WORKDIR (a cwd taken before the bind would still be on the read-only mount underneath).
JAIL = r"""
work=$1; shift
mount --bind "$work" "$work" || { echo "sandbox: cannot bind $work" >&2; exit 125; }
for point in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  case "$point" in "$work"|/proc|/proc/*) continue;; esac
  mount -o remount,bind,ro "$point" || { echo "sandbox: cannot make $point read-only" >&2; exit 125; }
done
cd "$work" || exit 125  # re-enter through the writable bind mount
exec "$@"
"""

# Python's part of the "process" level (the whole of its network block).
SOCKET_BLOCK = '''"""Sandbox: Python code in this process may not open network sockets."""
import socket

_Socket = socket.socket


class _NoNetwork(_Socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            raise OSError("network access is disabled in the sandbox")
        super().__init__(family, type, proto, fileno)


socket.socket = _NoNetwork
'''


class SandboxError(RuntimeError):
    """The sandbox cannot run as configured (an isolation level that this machine does not allow)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one run may use. `output_bytes` is what is kept of its output (head and tail)."""

    wall_seconds: float = 20.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    processes: int = 64
    file_bytes: int = 16 << 20
    open_files: int = 256
    output_bytes: int = 16 << 10
    max_output_bytes: int = 8 << 20


@dataclasses.dataclass(frozen=True)
class RunResult:
    """exit_code: the command's exit status (negative: the signal that ended it), None when the sandbox
    killed it; status: "exited", "timeout" (wall clock) or "output_limit"."""

    exit_code: int | None
    status: str
    output: str
    output_bytes: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0


def _unshare_command() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "--mount-proc", "--net", "--pid",
            "--fork", "--kill-child", "sh", "-c", JAIL, "jail"]


@functools.cache
def namespaces_available() -> bool:
    """Whether a run in the "namespaces" level works on this machine (probed once per process)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as work:
        try:
            probe = subprocess.run([*_unshare_command(), work, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
    if probe.returncode != 0:
        complaint = probe.stderr.decode(errors="replace").strip().splitlines() or [f"exit {probe.returncode}"]
        log.warning("sandbox: namespaces unavailable (%s); test runs use the weaker 'process' isolation",
                    complaint[-1])
    return probe.returncode == 0


def resolve_isolation(isolation: str) -> str:
    """The level `isolation` stands for here ("auto" becomes "namespaces" or "process")."""
    if isolation not in ISOLATIONS:
        raise SandboxError(f"sandbox isolation {isolation!r} is unknown; known: {', '.join(ISOLATIONS)}")
    if isolation == "auto":
        return "namespaces" if namespaces_available() else "process"
    if isolation == "namespaces" and not namespaces_available():
        raise SandboxError("sandbox isolation 'namespaces' is not available here (unshare missing or not "
                           "permitted); use 'process' or 'auto'")
    return isolation


def _user_processes() -> int:
    uid = os.geteuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:  # the process ended meanwhile
                pass
    return count


def _limit_resources(limits: Limits, processes: int):
    """The preexec function: the rlimits of the child (and everything it starts)."""
    settings = ((resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_AS, limits.memory_bytes),
                (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_FSIZE, limits.file_bytes),
                (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0))

    def limit() -> None:
        for which, value in settings:
            resource.setrlimit(which, (value, value))

    return limit


def _environment(work: pathlib.Path, isolation: str) -> dict[str, str]:
    home, tmp = work / ".sandbox" / "home", work / ".sandbox" / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0", "GIT_CEILING_DIRECTORIES": str(work.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    if isolation == "process":
        site = work / ".sandbox" / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SOCKET_BLOCK)
        env["PYTHONPATH"] = str(site)
    return env


class _Output:
    """Head and tail of a stream, at most `keep` bytes in all, and the total length."""

    def __init__(self, keep: int):
        self.half = keep // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            del self.tail[:len(self.tail) - self.half]

    def text(self) -> str:
        elided = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {elided} bytes of output elided ...]\n".encode() if elided else b""
        return bytes(self.head + middle + self.tail).decode(errors="replace")


def run(command: list[str], work: str | pathlib.Path, limits: Limits = Limits(),
        isolation: str = "auto") -> RunResult:
    """Run `command` with cwd `work` (its only writable directory under "namespaces"), under `limits`."""
    work = pathlib.Path(work).resolve()
    level = resolve_isolation(isolation)
    wrapped = [*_unshare_command(), str(work), *command] if level == "namespaces" else command
    processes = limits.processes + (_user_processes() if os.geteuid() != 0 else 0)
    start = time.monotonic()
    with warnings.catch_warnings():
        # JAX warns at every fork of its process; this child only sets its rlimits and execs.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        proc = subprocess.Popen(wrapped, cwd=work, env=_environment(work, level),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_limit_resources(limits, processes))
    output, status = _Output(limits.output_bytes), "exited"
    deadline = start + limits.wall_seconds
    fd = proc.stdout.fileno()
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.1))
            if not ready:
                if proc.poll() is not None:
                    break  # it exited, but something it left behind holds the pipe open
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # EOF: every writer closed the pipe; wait for the exit itself
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    status = "timeout"
                break
            output.add(chunk)
            if output.total > limits.max_output_bytes:
                status = "output_limit"
                break
    finally:
        _kill_group(proc)
        proc.stdout.close()
    exit_code = proc.returncode if status == "exited" else None
    return RunResult(exit_code, status, output.text(), output.total, time.monotonic() - start)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
