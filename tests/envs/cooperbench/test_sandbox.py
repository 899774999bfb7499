"""The sandbox contains what test code can do wrong: loops, forks, writes outside, floods, memory, network.

Each case runs under both isolation levels (the "namespaces" one is skipped where unshare is not allowed);
where "process" does not contain something (docs/cooperbench.md), the test says so explicitly.
"""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from scope_jax.envs.cooperbench import cgroup, sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos

NO_NAMESPACES = pytest.mark.skipif(not sandbox.namespaces_available(),
                                   reason="unshare namespaces are not permitted here")
LEVELS = [pytest.param("namespaces", marks=NO_NAMESPACES), "process"]


def _run(tmp_path, code: str, level: str, **limits) -> sandbox.RunResult:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return sandbox.run([sys.executable, "-c", textwrap.dedent(code)], work,
                       sandbox.Limits(**{"wall_seconds": 20.0, **limits}), level)


@pytest.mark.parametrize("level", LEVELS)
def test_infinite_loop_is_killed_at_the_wall_clock(tmp_path, level):
    result = _run(tmp_path, "while True: pass", level, wall_seconds=1.0)
    assert (result.status, result.exit_code, result.ok) == ("timeout", None, False)
    assert result.seconds < 6.0


def _growing(path, wait=0.5) -> bool:
    before = path.stat().st_size if path.exists() else -1
    time.sleep(wait)
    return path.exists() and path.stat().st_size != before


FORKER = """
    import os, subprocess, sys, time
    beat = '''import sys, time
    while True:
        with open(sys.argv[1], "a") as f:
            f.write("x")
        time.sleep(0.02)'''
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen([sys.executable, "-c", beat, "child.beat"], **quiet)
    {detached}
    deadline = time.time() + 15
    while not all(os.path.exists(f) for f in {beats!r}) and time.time() < deadline:
        time.sleep(0.02)  # until the heartbeats have started
    print("parent done")
"""


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("level", LEVELS)
def test_forked_processes_die_with_the_run(tmp_path, level):
    detached = ('subprocess.Popen([sys.executable, "-c", beat, "detached.beat"], start_new_session=True, '
                '**quiet)' if level == "namespaces" else "")  # "process" cannot catch a new session
    beats = ["child.beat", "detached.beat"] if detached else ["child.beat"]
    result = _run(tmp_path, FORKER.format(detached=detached, beats=beats), level)
    assert result.ok and "parent done" in result.output
    if level == "namespaces":  # the heartbeats were in the jail: no process of the run's uid is left
        assert result.uid in sandbox.SANDBOX_UIDS and _processes_of(result.uid) == []
    for name in beats if level == "process" else []:
        beat = tmp_path / "work" / name
        assert beat.exists() and not _growing(beat), f"{name}: a process outlived the run"


@pytest.mark.parametrize("level", LEVELS)
def test_writes_outside_the_work_directory(tmp_path, level):
    outside = tmp_path / "outside"
    outside.mkdir()
    result = _run(tmp_path, f"""
        open("inside.txt", "w").write("ok")
        print("inside:", open("inside.txt").read())
        open({str(outside / "planted.txt")!r}, "w").write("escaped")
    """, level)
    assert "inside: ok" in result.output
    if level == "namespaces":  # the folder does not even exist in the jail
        assert not result.ok and "No such file or directory" in result.output
        assert not (outside / "planted.txt").exists() and not (tmp_path / "work" / "inside.txt").exists()
    else:  # documented: the process level does not block writes outside
        assert result.ok and (outside / "planted.txt").exists()


@pytest.mark.parametrize("level", LEVELS)
def test_a_gigabyte_of_output_is_cut_off(tmp_path, level):
    result = _run(tmp_path, """
        import sys
        sys.stdout.write("START")
        for _ in range(1024):
            sys.stdout.write("x" * (1 << 20))
    """, level, max_output_bytes=1 << 20, output_bytes=1000)
    assert (result.status, result.ok) == ("output_limit", False)
    assert (1 << 20) < result.output_bytes < (64 << 20)
    assert result.output.startswith("START") and "bytes of output elided" in result.output
    assert len(result.output) < 1100


@pytest.mark.parametrize("level", LEVELS)
def test_a_gigabyte_file_is_cut_off(tmp_path, level):
    result = _run(tmp_path, """
        import os, sys
        try:
            with open("big.bin", "wb") as f:
                for _ in range(1024):
                    f.write(b"x" * (1 << 20))
        except OSError as e:
            sys.exit(f"size {os.path.getsize('big.bin')}: {e}")
    """, level, file_bytes=1 << 20)
    assert not result.ok and "File too large" in result.output
    assert int(result.output.split("size ")[1].split(":")[0]) <= 1 << 20


@pytest.mark.parametrize("level", LEVELS)
def test_memory_is_limited(tmp_path, level):
    result = _run(tmp_path, "block = bytearray(2 << 30)", level, memory_bytes=512 << 20)
    assert not result.ok and "MemoryError" in result.output


def test_cpu_time_is_limited(tmp_path):
    result = _run(tmp_path, "while True: pass", "process", cpu_seconds=1, wall_seconds=60.0)
    assert result.status == "exited" and result.exit_code != 0  # killed by the CPU limit, not the clock


CONNECT = """
    import socket, sys
    socket.socket(socket.AF_UNIX).close()  # local sockets stay allowed
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    except OSError as e:
        sys.exit(f"no network: {{e}}")
    print("connected")
"""


@pytest.mark.parametrize("level", LEVELS)
def test_no_network(tmp_path, level):
    with socket.create_server(("127.0.0.1", 0)) as server:
        code = textwrap.dedent(CONNECT.format(port=server.getsockname()[1]))
        control = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert control.stdout.strip() == "connected"  # outside the sandbox the server is reachable
        result = _run(tmp_path, code, level)
    assert not result.ok and "no network" in result.output


@pytest.mark.parametrize("level", LEVELS)
def test_environment_is_scrubbed(tmp_path, level, monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = _run(tmp_path, """
        import os, tempfile
        print(sorted(k for k in os.environ if "proxy" in k.lower() or k == "SECRET_TOKEN"))
        print(os.environ["HOME"].startswith(os.getcwd()), tempfile.gettempdir().startswith(os.getcwd()))
    """, level)
    assert result.ok and result.output.split("\n")[:2] == ["[]", "True True"]


def test_unknown_isolation_is_refused(tmp_path):
    with pytest.raises(sandbox.SandboxError, match="'jail' is unknown"):
        sandbox.run(["true"], tmp_path, isolation="jail")


def test_a_missing_cgroup_is_a_counted_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.Cgroup, "make", classmethod(lambda cls, cap: None))
    caps = ("no memory cgroup: memory is capped per process only",
            "no cpu cgroup: CPU time is capped per process only, at a lower priority")
    before = [sandbox.FALLBACKS[cap] for cap in caps]
    result = _run(tmp_path, "import os; print('niceness', os.nice(0))", "process")
    assert result.ok and set(caps) <= set(result.fallbacks) and f"niceness {min(os.nice(0) + sandbox.NICENESS, 19)}" in result.output
    assert [sandbox.FALLBACKS[cap] for cap in caps] == [n + 1 for n in before]


NAMESPACES = ("mnt", "net", "pid", "ipc", "uts", "cgroup")


@NO_NAMESPACES
def test_every_namespace_is_the_runs_own_and_no_user_namespace_can_be_made(tmp_path):
    result = _run(tmp_path, f"""
        import os, subprocess
        print({{kind: os.readlink(f"/proc/self/ns/{{kind}}") for kind in {NAMESPACES!r}}})
        print("userns", subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode)
    """, "namespaces")
    inside = eval(result.output.splitlines()[0])
    assert all(inside[kind] != os.readlink(f"/proc/self/ns/{kind}") for kind in NAMESPACES), inside
    assert result.ok and "userns 1" in result.output


SPINNERS = """
    import os, time
    for _ in range(2):
        if os.fork() == 0:
            end = time.time() + 2
            while time.time() < end:
                pass
            os._exit(0)
    os.wait(), os.wait()
    print("cpu", os.times().children_user + os.times().children_system)
"""


@pytest.mark.skipif(not cgroup.available("cpu"), reason="no cpu cgroup here")
def test_a_run_gets_at_most_its_share_of_the_cpus(tmp_path):
    # 2 spinners for 2 s of wall clock: at a twentieth of a core, at most 0.1 s of CPU (plus slack),
    # whatever the machine's load; with 4 cores' quota, what the load leaves them
    level = "namespaces" if sandbox.namespaces_available() else "process"
    capped, free = (_run(tmp_path, SPINNERS, level, cpus=cpus) for cpus in (0.05, 4.0))
    capped, free = (float(r.output.split("cpu ")[1]) for r in (capped, free))
    assert capped < 0.1 + 0.1 and capped < free / 2, (capped, free)


@NO_NAMESPACES
def test_the_jail_tools_come_from_the_system_folders_never_from_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    sandbox.jail_problem.cache_clear()
    try:
        result = _run(tmp_path, "import os; print('uid', os.getuid())", "namespaces")
        assert result.ok and f"uid {result.uid}" in result.output and result.uid in sandbox.SANDBOX_UIDS
        monkeypatch.setattr(sandbox, "TOOL_DIRS", (str(tmp_path),))  # and none where they are looked up
        sandbox.jail_problem.cache_clear()
        with pytest.raises(sandbox.SandboxError) as refused:
            _run(tmp_path, "print('ran')", "namespaces")
        assert "\n" not in str(refused.value) and "refusing to run untrusted code" in str(refused.value)
        assert "unshare" in str(refused.value) and "isolation='process'" in str(refused.value)
        with pytest.raises(sandbox.SandboxError, match="refusing to run untrusted code"):
            Evaluator(Repos(tmp_path / "repos"))
    finally:
        sandbox.jail_problem.cache_clear()
