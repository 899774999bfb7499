"""The sandbox: every test run is a subprocess with hard limits, on a throwaway copy of its run tree.

Each run gets
- a wall-clock limit: at the limit (or when it floods its output) its whole process group is killed;
- resource limits on every process: CPU seconds, address space, number of processes, size of any file
  written, open files, no core dumps;
- a memory cap and a CPU quota (`cpus` cores) on the whole process tree: a cgroup of each controller
  (cgroup.py) where one can be made, else a counted, logged fallback (`FALLBACKS`, and the run's
  `fallbacks`) to the per-process address space, and to RLIMIT_CPU at a lower priority (nice);
- a scrubbed environment: HOME and TMPDIR inside the run tree, no proxy variables, no bytecode files, a
  fixed hash seed, git confined to the run tree, and a safe import path: PYTHONSAFEPATH, and a
  `sitecustomize` that puts the working directory at the *end* of sys.path, so that a `pytest.py`,
  `_pytest/` or any module of the repository cannot shadow an installed one;
- capped output: stdout and stderr together are read as they come and only the first and last
  `output_bytes / 2` bytes are kept; a run that writes more than `max_output_bytes` is killed;
- optionally a report channel: a pipe of its own, read whole up to `report_bytes`;
- one of two isolation levels, never chosen for the caller:
  "namespaces"  (the default) `unshare` runs the command in new mount, network, pid, IPC, UTS and cgroup
                namespaces, in a jail (JAIL): a fresh root on a tmpfs of `disk_bytes` (the disk cap)
                holding a copy of the run tree at its own path (root's, but for the `writable` paths),
                read-only binds of /usr (and /bin, /lib, /lib64, /sbin) and of Python's prefix,
                /dev/{null,zero,random,urandom}, and a fresh /proc of the new pid namespace; the old root
                is unmounted (pivot_root), and the command is chrooted one folder below the new root,
                which keeps it from making user namespaces. Nothing else of the host exists in there: no
                task folder, no base checkout, no /work, no /tmp. The command runs as an unprivileged uid
                of its own (`SANDBOX_UIDS`, one per run) with an empty capability bounding set and
                no_new_privs, so it cannot remount, mount, chroot or gain privileges. No network (only a
                loopback device, down). Every process and IPC object of the run dies with it (the command
                is the namespaces' init). What the run writes stays in the jail and is gone afterwards.
                The jail's tools are looked up in the system folders (TOOL_DIRS), never on PATH; where
                the jail cannot be built, a run refuses in one line (`SandboxError`) saying why.
  "process"     only when named: the command runs in the run tree itself, as this user; the network is
                blocked only for Python code (the `sitecustomize` makes `socket.socket` refuse INET and
                INET6 sockets), writes outside the run tree are not blocked, there is no disk cap, and a
                process that leaves the process group (setsid) survives the kill. Every run at this level
                is counted as a fallback.

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
from typing import Mapping, Sequence

from scope_jax.envs.cooperbench.cgroup import Cgroup, cpu_cap, memory_cap

log = logging.getLogger(__name__)

ISOLATIONS = ("namespaces", "process")
SANDBOX_UIDS = range(200_000, 300_000)  # one unprivileged uid per run, in the "namespaces" level
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
TOOL_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")  # where the jail's tools are looked up, never PATH
JAIL_TOOLS = ("unshare", "sh", "mount", "umount", "pivot_root", "chroot", "setpriv", "prlimit", "cp", "chown")
FALLBACKS: collections.Counter[str] = collections.Counter()  # runs that went without a cap, by cap
NICENESS = 10  # the priority drop of a run that has no CPU cgroup
REPORT_FD_VARIABLE = "COOPERBENCH_REPORT_FD"

JAIL_SITE = "/.sandbox/site"  # the sitecustomize's folder in the jail (JAIL copies it there): root's

# Run inside the new namespaces as `sh -c JAIL jail WORK ROOT DISK UID BINDS RLIMITS WRITABLE -- COMMAND...`
# (BINDS: the folders to bind read-only, space-separated; RLIMITS: prlimit options; WRITABLE: the paths
# under WORK the command may write, space-separated). Lays out the jail under ROOT/jail on a tmpfs
# mounted at ROOT, with a copy of the run tree WORK at the same path, pivots into ROOT and execs the
# command chrooted into /jail as UID with no capabilities left. Being chrooted is what keeps it from
# making user namespaces (the kernel refuses CLONE_NEWUSER to a chrooted process). Its tools are looked
# up in the system folders only, whatever PATH the command gets.
JAIL = r"""
set -u
run_path=$PATH
PATH=/usr/sbin:/usr/bin:/sbin:/bin
fail() { echo "sandbox: $*" >&2; exit 125; }
work=$1 root=$2 disk=$3 uid=$4 binds=$5 rlimits=$6 writable=$7; shift 8
jail=$root/jail
mount -t tmpfs -o "size=$disk,mode=0755,nosuid" sandbox "$root" && mkdir "$jail" || fail "cannot mount a tmpfs"
for dir in $binds; do
  case $dir in /*/*) ;; *) ln -s "jail$dir" "$root$dir" ;; esac  # the tools' own paths, outside /jail
  if [ -L "$dir" ]; then ln -s "$(readlink "$dir")" "$jail$dir"; continue; fi
  [ -d "$dir" ] || continue
  mkdir -p "$jail$dir"
  mount --bind "$dir" "$jail$dir" && mount -o remount,bind,ro,nosuid "$jail$dir" || fail "cannot bind $dir"
done
mkdir -p "$jail/dev" "$jail/proc" "$jail/tmp" "$jail$work" || fail "cannot lay out the root"
chmod 1777 "$jail/tmp"
for device in null zero random urandom; do
  touch "$jail/dev/$device" && mount --bind "/dev/$device" "$jail/dev/$device" || fail "cannot bind $device"
done
mount -t proc -o nosuid,nodev,noexec proc "$jail/proc" && ln -s jail/proc "$root/proc" || fail "cannot mount /proc"
cp -a "$work/." "$jail$work/" || fail "cannot copy the run tree (disk cap $disk bytes?)"
chown -R root:root "$jail$work" && chmod 0755 "$jail$work" || fail "cannot own the run tree"
for path in $writable .sandbox/home .sandbox/tmp; do
  chown -R "$uid:$uid" "$jail$work/$path" || fail "cannot hand $path over"
done
mkdir "$jail/.sandbox" && cp -a "$work/.sandbox/site" "$jail/.sandbox/site" \
  || fail "cannot copy the site folder"
cd "$root" && mkdir .oldroot && pivot_root . .oldroot && umount -l /.oldroot && rmdir /.oldroot \
  || fail "cannot pivot into the jail"
chroot=$(command -v chroot) prlimit=$(command -v prlimit) setpriv=$(command -v setpriv) \
  sh=$(command -v sh) || fail "a tool of the jail is missing"
export PATH="$run_path"
exec "$chroot" /jail "$prlimit" $rlimits -- "$setpriv" --reuid="$uid" --regid="$uid" \
  --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- \
  "$sh" -c 'cd "$0" || exit 125; exec "$@"' "$work" "$@"
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
    cpus: float = 1.0  # CPU cores the whole run may use at once (a cgroup quota)
    report_bytes: int = 1 << 20  # the most the report channel may carry


@dataclasses.dataclass(frozen=True)
class RunResult:
    """exit_code: the command's exit status (negative: the signal that ended it), None when the sandbox
    killed it; status: "exited", "timeout" (wall clock) or "output_limit"; fallbacks: the caps this run
    went without; uid: the uid it ran as; report: what came through the report channel (None: the run
    had none)."""

    exit_code: int | None
    status: str
    output: str
    output_bytes: int
    seconds: float
    fallbacks: tuple[str, ...] = ()
    uid: int | None = None
    report: bytes | None = None

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


def _tool(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join(TOOL_DIRS))


def _unshare_command(work: pathlib.Path, root: str, limits: Limits, uid: int,
                     writable: Sequence[str]) -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [_tool("unshare"), *user, "--mount", "--propagation", "private", "--net", "--pid", "--ipc", "--uts",
            "--cgroup", "--fork", "--kill-child", _tool("sh"), "-c", JAIL, "jail", str(work), root,
            str(limits.disk_bytes), str(uid), _binds(), _rlimits(limits), " ".join(writable), "--"]


@functools.cache
def jail_problem() -> str | None:
    """Why the "namespaces" level cannot run here (None: it can); probed once per process."""
    missing = [tool for tool in JAIL_TOOLS if _tool(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found in {':'.join(TOOL_DIRS)}"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as work:
        work = pathlib.Path(work)
        env = _environment(work, "namespaces", {})
        with tempfile.TemporaryDirectory(prefix="sandbox-root-") as root:
            try:
                probe = subprocess.run([*_unshare_command(work, root, Limits(), SANDBOX_UIDS[0], ()), "true"],
                                       env=env, capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"the probe run failed: {e}"
    if probe.returncode != 0:
        complaint = probe.stderr.decode(errors="replace").strip().splitlines() or [f"exit {probe.returncode}"]
        return f"the probe run failed: {complaint[-1]}"
    return None


def namespaces_available() -> bool:
    return jail_problem() is None


def resolve_isolation(isolation: str) -> str:
    """`isolation` itself, once it is known to run here: "namespaces" refuses in one line when the jail
    cannot be built; "process", the weaker level, runs only when named."""
    if isolation not in ISOLATIONS:
        raise SandboxError(f"sandbox isolation {isolation!r} is unknown; known: {', '.join(ISOLATIONS)}")
    if isolation == "namespaces" and jail_problem() is not None:
        raise SandboxError(f"sandbox: refusing to run untrusted code, the jail cannot be built here "
                           f"({jail_problem()}); name isolation='process' to accept the weaker level")
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


def _prepare_child(limits: Limits | None, processes: int, cgroups: list[Cgroup], niceness: int):
    """The preexec function: join the run's cgroups, lower the priority where no CPU cgroup could be
    made, and (the "process" level: `limits` given) set the rlimits, which the "namespaces" level sets
    in the jail instead (prlimit)."""
    settings = () if limits is None else (
        (resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0))

    def prepare() -> None:
        for cgroup in cgroups:
            cgroup.join()
        if niceness:
            os.nice(niceness)
        for which, value in settings:
            resource.setrlimit(which, (value, value))

    return prepare


def _environment(work: pathlib.Path, isolation: str, site_modules: Mapping[str, str]) -> dict[str, str]:
    sandbox_dir = work / ".sandbox"
    home, tmp, site = sandbox_dir / "home", sandbox_dir / "tmp", sandbox_dir / "site"
    for folder in (home, tmp, site):
        folder.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(APPEND_CWD + (SOCKET_BLOCK if isolation == "process" else ""))
    for name, text in site_modules.items():
        (site / name).write_text(text)
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


def run(command: list[str], work: str | pathlib.Path, limits: Limits = Limits(),
        isolation: str = "namespaces", env: Mapping[str, str] | None = None, writable: Sequence[str] = (".",),
        site_modules: Mapping[str, str] | None = None, report: bool = False) -> RunResult:
    """Run `command` with cwd `work` (the run tree), under `limits`, with `env` added to the scrubbed
    environment; under "namespaces" on a copy of `work` in the jail (see the module docstring), so
    nothing the run writes comes back, and the command may write only the paths `writable` (relative to
    `work`; the rest is root's). `site_modules` (file name -> text) join the sitecustomize on the import
    path. With `report`, the command gets a pipe of its own, its file descriptor in REPORT_FD_VARIABLE,
    and what comes through it is the result's `report`."""
    work = pathlib.Path(work).resolve()
    level = resolve_isolation(isolation)
    env = {**_environment(work, level, site_modules or {}), **(env or {})}
    memory, cpu = Cgroup.make(memory_cap(limits.memory_bytes)), Cgroup.make(cpu_cap(limits.cpus))
    cgroups = [c for c in (memory, cpu) if c is not None]
    fallbacks = ([] if memory else [_fallback("no memory cgroup: memory is capped per process only")]) + (
        [] if cpu else [_fallback("no cpu cgroup: CPU time is capped per process only, at a lower priority")])
    niceness = 0 if cpu else NICENESS
    read_end, write_end = os.pipe() if report else (None, None)
    if report:
        env[REPORT_FD_VARIABLE] = str(write_end)
    uid = None
    try:
        with tempfile.TemporaryDirectory(prefix="sandbox-root-") as root:
            if level == "namespaces":
                uid = SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))]
                wrapped = [*_unshare_command(work, root, limits, uid, writable), *command]
                preexec = _prepare_child(None, 0, cgroups, niceness)
            else:
                fallbacks.append(_fallback("process isolation: no disk cap, no jail"))
                processes = limits.processes + (_user_processes() if os.geteuid() != 0 else 0)
                wrapped, preexec = command, _prepare_child(limits, processes, cgroups, niceness)
            result = _supervise(wrapped, work, env, preexec, limits, read_end, write_end)
    finally:
        for cgroup in cgroups:
            cgroup.close()
    return dataclasses.replace(result, fallbacks=tuple(fallbacks), uid=uid)


def _supervise(command: list[str], work: pathlib.Path, env: dict[str, str], preexec, limits: Limits,
               report_read: int | None, report_write: int | None) -> RunResult:
    start = time.monotonic()
    with warnings.catch_warnings():
        # JAX warns at every fork of its process; this child only sets its limits and execs.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        proc = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec,
                                pass_fds=() if report_write is None else (report_write,))
    if report_write is not None:
        os.close(report_write)
    output, status, report = _Output(limits.output_bytes), "exited", bytearray()
    deadline = start + limits.wall_seconds
    fd = proc.stdout.fileno()
    open_fds = [fd] + ([] if report_read is None else [report_read])
    try:
        while fd in open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select(open_fds, [], [], min(remaining, 0.1))
            if not ready:
                if proc.poll() is not None:
                    break  # it exited, but something it left behind holds the pipe open
                continue
            for ready_fd in ready:
                chunk = os.read(ready_fd, 1 << 16)
                if not chunk:
                    open_fds.remove(ready_fd)
                elif ready_fd == fd:
                    output.add(chunk)
                else:
                    report += chunk
            if output.total > limits.max_output_bytes or len(report) > limits.report_bytes:
                status = "output_limit"
                break
        if status == "exited":  # EOF: every writer closed the output; wait for the exit itself
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                status = "timeout"
    finally:
        _kill_group(proc)
        proc.stdout.close()
        if report_read is not None:
            report += _drain(report_read, limits.report_bytes + 1 - len(report))
            os.close(report_read)
    if len(report) > limits.report_bytes and status == "exited":
        status = "output_limit"
    exit_code = proc.returncode if status == "exited" else None
    return RunResult(exit_code, status, output.text(), output.total, time.monotonic() - start,
                     report=None if report_read is None else bytes(report))


def _drain(fd: int, most: int, patience: float = 1.0) -> bytes:
    """What is left in the pipe `fd` once the run is killed, up to `most` bytes (a writer that escaped
    the kill in the "process" level is not waited for beyond `patience` seconds)."""
    data, deadline = bytearray(), time.monotonic() + patience
    while len(data) < most and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return bytes(data[:most])


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
