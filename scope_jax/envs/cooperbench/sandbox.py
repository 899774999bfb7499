"""The sandbox: every test run is a subprocess with hard limits, on a throwaway copy of its run tree.

Each run gets
- a wall-clock limit: at the limit (or when it floods its output) its whole process group is killed;
- resource limits on every process: CPU seconds, address space, number of processes, size of any file
  written, open files, no core dumps;
- a memory cap on the whole process tree: a cgroup of its own (cgroup.py) where one can be made, else a
  counted, logged fallback (`FALLBACKS`, and the run's `fallbacks`) to the per-process address space;
- a scrubbed environment: HOME and TMPDIR inside the run tree, no proxy variables, no bytecode files, a
  fixed hash seed, git confined to the run tree, and a safe import path: PYTHONSAFEPATH, and a
  `sitecustomize` that puts the working directory at the *end* of sys.path, so that a `pytest.py`,
  `_pytest/` or any module of the repository cannot shadow an installed one;
- capped output: stdout and stderr together are read as they come and only the first and last
  `output_bytes / 2` bytes are kept; a run that writes more than `max_output_bytes` is killed;
- one of two isolation levels:
  "namespaces"  `unshare` runs the command in new mount, network and pid namespaces, in a jail (JAIL): a
                fresh root on a tmpfs of `disk_bytes` (the disk cap) holding a copy of the run tree at
                its own path, read-only binds of /usr (and /bin, /lib, /lib64, /sbin) and of Python's
                prefix, /dev/{null,zero,random,urandom}, and a fresh /proc of the new pid namespace; the
                old root is unmounted (pivot_root). Nothing else of the host exists in there: no task
                folder, no base checkout, no /work, no /tmp. The command runs as an unprivileged uid of
                its own (`SANDBOX_UIDS`, one per run) with an empty capability bounding set and
                no_new_privs, so it cannot remount, mount, chroot or gain privileges. No network (only a
                loopback device, down). Every process the command starts dies with it (the command is
                the namespace's init). What the run writes stays in the jail and is gone afterwards.
  "process"     no namespaces (no `unshare`, or it is not permitted here): the command runs in the run
                tree itself, as this user; the network is blocked only for Python code (the
                `sitecustomize` makes `socket.socket` refuse INET and INET6 sockets), writes outside the
                run tree are not blocked, there is no disk cap, and a process that leaves the process
                group (setsid) survives the kill.
  "auto" (the default) takes "namespaces" when a probe run in them succeeds, else "process".

docs/cooperbench.md lists what is and is not contained, as measured by the hostile-patch tests.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import pathlib
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Mapping

from scope_jax.envs.cooperbench.cgroup import MemoryCgroup

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "namespaces", "process")
SANDBOX_UIDS = range(200_000, 300_000)  # one unprivileged uid per run, in the "namespaces" level
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
DEVICES = ("null", "zero", "random", "urandom")
FALLBACKS: collections.Counter[str] = collections.Counter()  # runs that went without a cap, by cap

JAIL_SITE = "/.sandbox/site"  # the sitecustomize's folder in the jail (JAIL copies it there): root's

# Run inside the new namespaces as `sh -c JAIL jail WORK ROOT DISK UID BINDS RLIMITS -- COMMAND...`
# (BINDS: the folders to bind read-only, space-separated; RLIMITS: prlimit options). Builds the jail's
# root on a tmpfs mounted at ROOT, copies the run tree WORK into it at the same path, pivots into it and
# execs the command as UID with no capabilities left.
JAIL = r"""
set -u
fail() { echo "sandbox: $*" >&2; exit 125; }
work=$1 root=$2 disk=$3 uid=$4 binds=$5 rlimits=$6; shift 7
mount -t tmpfs -o "size=$disk,mode=0755,nosuid" sandbox "$root" || fail "cannot mount a tmpfs"
for dir in $binds; do
  if [ -L "$dir" ]; then ln -s "$(readlink "$dir")" "$root$dir"; continue; fi
  [ -d "$dir" ] || continue
  mkdir -p "$root$dir"
  mount --bind "$dir" "$root$dir" && mount -o remount,bind,ro,nosuid "$root$dir" || fail "cannot bind $dir"
done
mkdir -p "$root/dev" "$root/proc" "$root/tmp" "$root$work" || fail "cannot lay out the root"
chmod 1777 "$root/tmp"
for device in null zero random urandom; do
  touch "$root/dev/$device" && mount --bind "/dev/$device" "$root/dev/$device" \
    || fail "cannot bind /dev/$device"
done
mount -t proc -o nosuid,nodev,noexec proc "$root/proc" || fail "cannot mount /proc"
cp -a "$work/." "$root$work/" || fail "cannot copy the run tree (disk cap $disk bytes?)"
chown -R "$uid:$uid" "$root$work" || fail "cannot hand the run tree over"
mkdir "$root/.sandbox" && cp -a "$work/.sandbox/site" "$root/.sandbox/site" \
  || fail "cannot copy the site folder"
cd "$root" && mkdir .oldroot && pivot_root . .oldroot && umount -l /.oldroot && rmdir /.oldroot \
  || fail "cannot pivot into the jail"
cd "$work" || fail "cannot enter $work"
exec prlimit $rlimits -- setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all \
  --bounding-set=-all --no-new-privs -- "$@"
"""

# The sandbox's sitecustomize: the safe import path (both levels) and, in the "process" level, the
# network block for Python code.
APPEND_CWD = '''"""Sandbox: the working directory is importable, after every installed package."""
import os
import sys

sys.path.append(os.getcwd())
'''
SOCKET_BLOCK = '''
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
    """What one run may use. `memory_bytes` caps each process's address space and (in a cgroup) the whole
    tree's memory; `disk_bytes` caps the jail's tmpfs (the run tree's copy included); `output_bytes` is
    what is kept of the output (head and tail)."""

    wall_seconds: float = 20.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    disk_bytes: int = 256 << 20
    processes: int = 64
    file_bytes: int = 16 << 20
    open_files: int = 256
    output_bytes: int = 16 << 10
    max_output_bytes: int = 8 << 20


@dataclasses.dataclass(frozen=True)
class RunResult:
    """exit_code: the command's exit status (negative: the signal that ended it), None when the sandbox
    killed it; status: "exited", "timeout" (wall clock) or "output_limit"; fallbacks: the caps this run
    went without; uid: the uid it ran as."""

    exit_code: int | None
    status: str
    output: str
    output_bytes: int
    seconds: float
    fallbacks: tuple[str, ...] = ()
    uid: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0


def _binds() -> str:
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    covered = [p for p in prefixes if not any(p.startswith(d + "/") for d in SYSTEM_DIRS)]
    return " ".join([*SYSTEM_DIRS, *sorted(covered)])


def _rlimits(limits: Limits) -> str:
    return (f"--cpu={limits.cpu_seconds} --as={limits.memory_bytes} --nproc={limits.processes} "
            f"--fsize={limits.file_bytes} --nofile={limits.open_files} --core=0")


def _unshare_command(work: pathlib.Path, root: str, limits: Limits, uid: int) -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "--net", "--pid", "--fork",
            "--kill-child", "sh", "-c", JAIL, "jail", str(work), root, str(limits.disk_bytes), str(uid),
            _binds(), _rlimits(limits), "--"]


@functools.cache
def namespaces_available() -> bool:
    """Whether a run in the "namespaces" level works on this machine (probed once per process)."""
    if any(shutil.which(tool) is None for tool in ("unshare", "mount", "pivot_root", "setpriv", "prlimit")):
        return False
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as work:
        work = pathlib.Path(work)
        env = _environment(work, "namespaces")
        with tempfile.TemporaryDirectory(prefix="sandbox-root-") as root:
            try:
                probe = subprocess.run([*_unshare_command(work, root, Limits(), SANDBOX_UIDS[0]), "true"],
                                       env=env, capture_output=True, timeout=30)
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
        raise SandboxError("sandbox isolation 'namespaces' is not available here (unshare, pivot_root, "
                           "setpriv or prlimit missing or not permitted); use 'process' or 'auto'")
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


def _prepare_child(limits: Limits | None, processes: int, cgroup: MemoryCgroup | None):
    """The preexec function: join the run's cgroup, and (the "process" level: `limits` given) set the
    rlimits, which the "namespaces" level sets in the jail instead (prlimit)."""
    settings = () if limits is None else (
        (resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0))

    def prepare() -> None:
        if cgroup is not None:
            cgroup.join()
        for which, value in settings:
            resource.setrlimit(which, (value, value))

    return prepare


def _environment(work: pathlib.Path, isolation: str) -> dict[str, str]:
    sandbox_dir = work / ".sandbox"
    home, tmp, site = sandbox_dir / "home", sandbox_dir / "tmp", sandbox_dir / "site"
    for folder in (home, tmp, site):
        folder.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(APPEND_CWD + (SOCKET_BLOCK if isolation == "process" else ""))
    return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin",
                                       "/usr/sbin", "/sbin"]),
            "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0", "PYTHONSAFEPATH": "1",
            "PYTHONPATH": JAIL_SITE if isolation == "namespaces" else str(site),
            "GIT_CEILING_DIRECTORIES": str(work.parent), "GIT_CONFIG_NOSYSTEM": "1"}


def _fallback(cap: str) -> str:
    if not FALLBACKS[cap]:
        log.warning("sandbox: %s; counted in sandbox.FALLBACKS and in each run's record", cap)
    FALLBACKS[cap] += 1
    return cap


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


def run(command: list[str], work: str | pathlib.Path, limits: Limits = Limits(), isolation: str = "auto",
        env: Mapping[str, str] | None = None) -> RunResult:
    """Run `command` with cwd `work` (the run tree), under `limits`, with `env` added to the scrubbed
    environment; under "namespaces" on a copy of `work` in the jail (see the module docstring), so
    nothing the run writes comes back."""
    work = pathlib.Path(work).resolve()
    level = resolve_isolation(isolation)
    env = {**_environment(work, level), **(env or {})}
    cgroup = MemoryCgroup.make(limits.memory_bytes)
    fallbacks = [] if cgroup else [_fallback("no memory cgroup: memory is capped per process only")]
    uid = None
    with tempfile.TemporaryDirectory(prefix="sandbox-root-") as root:
        if level == "namespaces":
            uid = SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))]
            wrapped, preexec = ([*_unshare_command(work, root, limits, uid), *command],
                                _prepare_child(None, 0, cgroup))
        else:
            fallbacks += [_fallback("process isolation: no disk cap, no jail")]
            processes = limits.processes + (_user_processes() if os.geteuid() != 0 else 0)
            wrapped, preexec = command, _prepare_child(limits, processes, cgroup)
        try:
            result = _supervise(wrapped, work, env, preexec, limits)
        finally:
            if cgroup is not None:
                cgroup.close()
    return dataclasses.replace(result, fallbacks=tuple(fallbacks), uid=uid)


def _supervise(command: list[str], work: pathlib.Path, env: dict[str, str], preexec,
               limits: Limits) -> RunResult:
    start = time.monotonic()
    with warnings.catch_warnings():
        # JAX warns at every fork of its process; this child only sets its limits and execs.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        proc = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
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


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the run. Under "namespaces" the namespace's init (unshare's child) goes first: the kernel then
    kills and reaps everything in the namespace, and unshare reaps the init and exits, leaving no zombie
    (killing both at once would leave the init to this machine's pid 1 to reap)."""
    for child in _children(proc.pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
