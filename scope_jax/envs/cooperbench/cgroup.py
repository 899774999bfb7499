"""Caps on a whole process tree: one cgroup per sandbox run and controller, made under this process's own
cgroup. `memory_cap(limit)`: v2 `memory.max`, else v1 `memory.limit_in_bytes` (swap capped too);
`cpu_cap(cpus)`: v2 `cpu.max`, else v1 `cpu.cfs_quota_us`.

`Cgroup.make(cap)` returns None where no writable cgroup of that controller can be had (no cgroup file
system, not permitted, no such controller); the sandbox then counts and logs the fallback. A run's
processes join the cgroups before they exec (`join`); `close` kills whatever is still in one and
removes it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import signal
import time
import uuid

PREFIX = "cooperbench-sandbox-"


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, file system type, options) of each mount."""
    with open("/proc/self/mounts") as f:
        return [(fields[1], fields[2], fields[3]) for fields in (line.split() for line in f)]


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: "" for the v2 one, the controller names for v1 ones."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


@dataclasses.dataclass(frozen=True)
class Cap:
    """A controller's settings: (file, value) pairs for a v2 and for a v1 hierarchy; the first of each
    must be written, the others are written where they exist."""

    controller: str
    v2: tuple[tuple[str, str], ...]
    v1: tuple[tuple[str, str], ...]


def memory_cap(limit: int) -> Cap:
    # with swap, memory beyond the cap would be swapped out rather than refused
    return Cap("memory", (("memory.max", str(limit)), ("memory.swap.max", "0")),
               (("memory.limit_in_bytes", str(limit)), ("memory.memsw.limit_in_bytes", str(limit))))


def cpu_cap(cpus: float, period: int = 100_000) -> Cap:
    quota = max(int(cpus * period), 1000)
    return Cap("cpu", (("cpu.max", f"{quota} {period}"),),
               (("cpu.cfs_quota_us", str(quota)), ("cpu.cfs_period_us", str(period))))


def _candidates(controller: str) -> list[tuple[pathlib.Path, bool]]:
    """(parent folder, is v2) to try for `controller`, v2 first."""
    own, found = _own_paths(), []
    for point, kind, options in _mounts():
        if kind == "cgroup2" and "" in own:
            found.append((pathlib.Path(point + own[""]), True))
        elif kind == "cgroup" and controller in options.split(",") and controller in own:
            found.append((pathlib.Path(point + own[controller]), False))
    return sorted(found, key=lambda c: not c[1])


class Cgroup:
    """One run's cgroup of one controller."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.procs = path / "cgroup.procs"

    @classmethod
    def make(cls, cap: Cap) -> Cgroup | None:
        for parent, v2 in _usable(cap.controller):
            settings = cap.v2 if v2 else cap.v1
            path = parent / f"{PREFIX}{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                for i, (name, value) in enumerate(settings):
                    if i == 0 or (path / name).exists():
                        (path / name).write_text(value)
            except OSError:
                path.rmdir()
                continue
            return cls(path)
        return None

    def join(self) -> None:
        """Move the calling process into the cgroup (run in the child before it execs)."""
        with open(self.procs, "w") as f:
            f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def close(self, patience: float = 5.0) -> None:
        """Kill every process left in the cgroup, then remove it."""
        deadline = time.monotonic() + patience
        while True:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


CONTROL_FILES = {"memory": ("memory.max", "memory.limit_in_bytes"), "cpu": ("cpu.max", "cpu.cfs_quota_us")}


@functools.cache
def _usable(controller: str) -> tuple[tuple[pathlib.Path, bool], ...]:
    """The candidates where a child with the controller's limit file can be made (probed once)."""
    usable = []
    for parent, v2 in _candidates(controller):
        probe = parent / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / CONTROL_FILES[controller][0 if v2 else 1]).exists():
                usable.append((parent, v2))
        finally:
            probe.rmdir()
    return tuple(usable)


def available(controller: str) -> bool:
    return bool(_usable(controller))
