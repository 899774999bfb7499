"""A memory cap on a whole process tree: one cgroup per sandbox run (v2 `memory.max`, else v1
`memory.limit_in_bytes`), made under this process's own cgroup.

`MemoryCgroup.make(limit)` returns None where no writable memory cgroup can be had (no cgroup file
system, not permitted, no memory controller); the sandbox then counts and logs the fallback (each process
keeps only its own RLIMIT_AS). A run's processes join the cgroup before they exec (`join`); `close` kills
whatever is still in it and removes it.
"""

from __future__ import annotations

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


def _candidates() -> list[tuple[pathlib.Path, str, str]]:
    """(parent folder, limit file, swap limit file) to try, v2 first."""
    own, found = _own_paths(), []
    for point, kind, options in _mounts():
        if kind == "cgroup2" and "" in own:
            found.append((pathlib.Path(point + own[""]), "memory.max", "memory.swap.max"))
        elif kind == "cgroup" and "memory" in options.split(",") and "memory" in own:
            found.append((pathlib.Path(point + own["memory"]), "memory.limit_in_bytes",
                          "memory.memsw.limit_in_bytes"))
    return sorted(found, key=lambda c: c[1] != "memory.max")


class MemoryCgroup:
    """One run's cgroup, capped at `limit` bytes of memory for all its processes together."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.procs = path / "cgroup.procs"

    @classmethod
    def make(cls, limit: int) -> MemoryCgroup | None:
        for parent, limit_file, swap_file in _usable():
            path = parent / f"{PREFIX}{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / limit_file).write_text(str(limit))
            except OSError:
                path.rmdir()
                continue
            try:  # with swap, memory beyond the cap would be swapped out rather than refused
                (path / swap_file).write_text(str(limit if swap_file.startswith("memory.memsw") else 0))
            except OSError:
                pass
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


@functools.cache
def _usable() -> tuple[tuple[pathlib.Path, str, str], ...]:
    """The candidates where a child with a memory limit file can be made (probed once)."""
    usable = []
    for parent, limit_file, swap_file in _candidates():
        probe = parent / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / limit_file).exists():
                usable.append((parent, limit_file, swap_file))
        finally:
            probe.rmdir()
    return tuple(usable)


def available() -> bool:
    return bool(_usable())
