"""Hostile code under test, sent through `Evaluator.evaluate` on a real-layout task (real_layout.py): one row
per probe of issues 24 and 34. The code sits in `pkg/__init__.py`, which the hidden tests import, so it
runs in the test process at collection. Each row is bounded in time and scores 0, or 1 only where the code
also implements the feature correctly; after each row nothing of it is left on the host: no escape file,
the base checkout's hash unchanged, no process and no SysV IPC object of the run. Needs the "namespaces"
isolation (docs/cooperbench.md says what the "process" level does not contain)."""

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import socket
import sys
import textwrap

import pytest

from scope_jax.envs.cooperbench import cgroup, sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import load_tasks
from tests.envs.cooperbench import real_layout

pytestmark = pytest.mark.skipif(not sandbox.namespaces_available(),
                                reason="unshare namespaces are not permitted here")

# The wall clock leaves room for a loaded machine (pytest alone can take 8 s at a load of 12 on 2
# cores); the CPU limit is above it, so an infinite loop always ends at the wall clock.
LIMITS = sandbox.Limits(wall_seconds=15.0, cpu_seconds=20, memory_bytes=512 << 20, disk_bytes=64 << 20,
                        max_output_bytes=1 << 20)
IMPLEMENTATION = real_layout.SOURCES[1].encode()
FIND_PIPE = """
        def pipe_fds():  # the output pipe, under pytest's capture
            for fd in range(3, 64):
                try:
                    if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                        yield fd
                except OSError:
                    pass
"""  # indented as the probes' code, which is dedented as a whole
FORGE_REPORTS = """
        import _pytest.reports
        _made = _pytest.reports.TestReport.from_item_and_call.__func__

        def _forged(cls, item, call):  # failed calls become passes, but for the tests SPARE picks
            report = _made(cls, item, call)
            if report.when == "call" and report.failed and not SPARE(item):
                report.outcome, report.longrepr = "passed", None
            return report

        _pytest.reports.TestReport.from_item_and_call = classmethod(_forged)
"""
EVIL_PLUGIN = (b"import pytest\nprint('EVIL PLUGIN LOADED')\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
               b"def pytest_runtest_call(item):\n    item.runtest = lambda: None\n    yield\n")
WRITE_OUTSIDE = """
        for target in P["targets"]:
            try:
                open(target, "w").write("escaped")
            except OSError:
                pass
"""


@dataclasses.dataclass(frozen=True)
class Probe:
    code: str  # Python run at the import of pkg (P: the parameters, a dict)
    implements: bool = False  # the change also implements feature 1 correctly
    files: tuple[tuple[str, bytes | None], ...] = ()  # more of the change
    expected: float = 0.0
    check: str = ""  # what the output must (not) show, see `_check`


PROBES = {
    "remount / read-write, then write outside": Probe("""
        import subprocess
        for point in ["/", *{l.split()[1] for l in open("/proc/self/mounts")}]:
            subprocess.run(["mount", "-o", "remount,rw,bind", point], capture_output=True)
    """ + WRITE_OUTSIDE),
    "the same route into the base checkout": Probe("""
        import subprocess
        subprocess.run(["mount", "-o", "remount,rw,bind", "/"], capture_output=True)
        try:
            open(P["base"] + "/pkg/core.py", "w").write(P["implementation"])
            subprocess.run(["git", "-C", P["base"], "commit", "-qam", "x"], capture_output=True)
        except OSError:
            pass
    """, check="base"),
    "the task folder through /proc, exec its combined.patch": Probe("""
        import glob
        mounts = [line.split()[1] for line in open("/proc/self/mounts")]
        places = [P["task"], *(point + P["task"] for point in mounts)]
        for cmdline in glob.glob("/proc/*/cmdline"):
            try:
                arguments = open(cmdline, "rb").read().decode(errors="replace").split("\\0")
                places += [a for a in arguments if a.startswith("/")]
            except OSError:
                pass
        for place in places:
            for name in ("combined.patch", "feature1/feature.patch"):
                path = os.path.join(place if os.path.isdir(place) else os.path.dirname(place), name)
                try:
                    patch = open(path).read()
                except OSError:
                    continue
                core = patch.split("+++ b/pkg/core.py")[1]
                new = [l[1:] for l in core.splitlines() if l.startswith("+") and not l.startswith("+++")]
                open(os.path.join(os.path.dirname(__file__), "core.py"), "w").write("\\n".join(new) + "\\n")
                break
    """),
    "a no-op _pytest Function.runtest": Probe("""
        import _pytest.python
        _pytest.python.Function.runtest = lambda self: None
    """, check="tampered"),
    "pytest's reports rewritten, sparing xfail-marked and canary-named tests": Probe(
        "SPARE = lambda item: 'canary' in item.name or item.get_closest_marker('xfail') is not None\n"
        + textwrap.dedent(FORGE_REPORTS), check="tampered"),
    "pytest's reports rewritten, sparing tests with a random suffix": Probe(
        "import re\nSPARE = lambda item: re.search('_[0-9a-f]{6}$', item.name) is not None\n"
        + textwrap.dedent(FORGE_REPORTS),
        check="not tampered"),
    "a forged report: every test function of the test files passed": Probe("""
        import ast, glob, json
        fd = int(os.environ["COOPERBENCH_REPORT_FD"])
        for path in glob.glob("tests/test_*.py"):
            for node in ast.parse(open(path).read()).body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                    for when in ("setup", "call", "teardown"):
                        record = {"nodeid": f"{path}::{node.name}", "when": when, "outcome": "passed",
                                  "xfail": False}
                        os.write(fd, (json.dumps(record) + "\\n").encode())
        os.write(fd, b'{"finished": 0}\\n')
        os._exit(0)
    """, check="tampered"),
    "a report line json.loads cannot read (a 5000-digit integer)": Probe("""
        os.write(int(os.environ["COOPERBENCH_REPORT_FD"]), b'{"finished": ' + b"9" * 5000 + b"}\\n")
    """, implements=True, check="reason no complete test report"),
    "a fake summary at import, then os._exit(0)": Probe(FIND_PIPE + """
        for fd in pipe_fds():
            os.write(fd, b"tests/test_core.py::test_shout PASSED\\n2 passed in 0.01s\\n")
        os._exit(0)
    """, check="reason no complete test report"),
    "an atexit hook that prints a fake summary and exits 0": Probe(FIND_PIPE + """
        import atexit

        def fake():
            for fd in pipe_fds():
                os.write(fd, b"2 passed in 0.01s\\n")
            os._exit(0)

        atexit.register(fake)
    """, check="reason no complete test report"),
    "a line appended to run_tests.sh": Probe("""
        script = os.path.join(os.path.dirname(os.getcwd()), "run_tests.sh")
        try:
            with open(script, "a") as f:
                f.write("\\necho '2 passed in 0.01s'; exit 0\\n")
            appended = 1
        except OSError:
            appended = 0
        raise RuntimeError(f"APPENDED {appended} END")
    """, check="appended"),
    "a .pytest.ini that loads a plugin of the change": Probe("", files=(
        (".pytest.ini", b"[pytest]\naddopts = -p pkg.evil\n"), ("pkg/evil.py", EVIL_PLUGIN)), check="no plugin"),
    "a dist-info whose pytest11 entry point loads a plugin of the change": Probe("", files=(
        ("evil-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"),
        ("evil-1.0.dist-info/entry_points.txt", b"[pytest11]\nevil = pkg.evil\n"), ("pkg/evil.py", EVIL_PLUGIN)),
        check="no plugin"),
    "a SysV shared memory segment left behind": Probe("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(int(P["token"][:7], 16), 64 << 20, 0o1000 | 0o666)  # IPC_CREAT
        raise RuntimeError(f"SHMID {shmid} END")
    """, check="ipc"),
    "a nested user namespace": Probe("""
        import subprocess
        done = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
        raise RuntimeError(f"USERNS {done.returncode} END")
    """, check="userns"),
    "a pytest.py and a _pytest/ at the repo root": Probe("", files=(
        ("pytest.py", b"import os\nprint('FAKE PYTEST')\nprint('2 passed in 0.01s')\nos._exit(0)\n"),
        ("_pytest/__init__.py", b"import os\nprint('FAKE PYTEST')\nos._exit(0)\n")), check="no fake"),
    "a conftest.py at the repo root": Probe("", files=(
        ("conftest.py", b"import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_call(item):\n"
                        b"    item.runtest = lambda: None\n    yield\n"),), check="dropped"),
    "48 files of 4 MiB - 1 (the disk cap is 64 MiB)": Probe("""
        total = 0
        for i in range(48):
            try:
                with open(f"fill{i}.bin", "wb") as f:
                    f.write(b"x" * ((4 << 20) - 1))
                total += (4 << 20) - 1
            except OSError:
                break
        raise RuntimeError(f"WROTE {total} END")
    """, check="disk"),
    "3 children of 200 MB (the memory cap is 512 MiB)": Probe("""
        import time
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                block = bytearray(200 << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(1)
                os._exit(0)
            pids.append(pid)
        alive = sum(os.waitpid(pid, 0)[1] == 0 for pid in pids)
        raise RuntimeError(f"ALIVE {alive} END")
    """, check="memory"),
    "an infinite loop": Probe("while True:\n    pass\n", check="status timeout"),
    "300 spawned processes": Probe("""
        import time
        spawned = 0
        for _ in range(300):
            try:
                if os.fork() == 0:
                    time.sleep(600)
                    os._exit(0)
            except OSError:
                break
            spawned += 1
        raise RuntimeError(f"SPAWNED {spawned} END")
    """, check="processes"),
    "1 GiB on stdout": Probe(FIND_PIPE + """
        for fd in pipe_fds():
            for _ in range(1024):
                os.write(fd, b"x" * (1 << 20))
    """, check="status output_limit"),
    "a 2 GiB file": Probe("""
        try:
            with open("big.bin", "wb") as f:
                for _ in range(2048):
                    f.write(b"x" * (1 << 20))
        except OSError:
            pass
        raise RuntimeError(f"SIZE {os.path.getsize('big.bin')} END")
    """, check="file"),
    "a socket to a server on the host": Probe("""
        import socket
        try:
            socket.create_connection(("127.0.0.1", P["port"]), timeout=2).close()
        except OSError as e:
            print("no network:", e)
    """, implements=True, expected=1.0),
    "plain writes outside the run tree": Probe(WRITE_OUTSIDE, implements=True, expected=1.0),
    "deleted and edited hidden tests": Probe("""
        for root, _, names in os.walk(os.getcwd()):
            for name in names:
                if name.startswith("test_"):
                    open(os.path.join(root, name), "w").write("def test_ok():\\n    pass\\n")
    """, files=(("tests/test_core.py", None),)),
    "sys.exit(0) at import": Probe("sys.exit(0)\n"),
    "os._exit(0) at import": Probe("os._exit(0)\n"),
    "a correct implementation (control)": Probe("", implements=True, expected=1.0),
}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    real_layout.build(root)
    [task] = load_tasks(root / "demo_task")
    repos = Repos(root / "scratch")
    evaluator = Evaluator(repos, LIMITS, isolation="namespaces")
    evaluator.gold(task, 1)
    yield task, evaluator, root
    repos.close()


def _tree_hash(folder: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _processes(uid: int | None, token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry.name}/cmdline", "rb").read()
            if entry.stat().st_uid == uid or token.encode() in cmdline:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _ipc_objects(uid: int | None) -> list[str]:
    """The SysV IPC objects on the host owned by `uid` (lines of /proc/sysvipc)."""
    found = []
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as f:
            found += [line for line in f.readlines()[1:] if str(uid) in line.split()]
    return found


def _number(output: str, word: str) -> int | None:
    match = re.search(rf"{word} (\d+) END", output)
    return int(match.group(1)) if match else None


SLOW = {"an infinite loop"}  # waits out the wall clock; test_sandbox.py has a cheap one


ROWS = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in PROBES]


@pytest.mark.parametrize("name", ROWS)
def test_hostile_patch(hostile, name, tmp_path):
    task, evaluator, root = hostile
    probe, token = PROBES[name], os.urandom(8).hex()
    base = evaluator.repos.base(task)
    targets = [str(tmp_path / f"escape-{token}"), f"/usr/escape-{token}", f"{sys.base_prefix}/escape-{token}"]
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    params = {"targets": targets, "base": str(base), "task": str(task.path), "token": token,
              "port": server.getsockname()[1], "implementation": IMPLEMENTATION.decode()}
    init = (f"import json, os, sys\nP = json.loads({json.dumps(params)!r})\n" + textwrap.dedent(probe.code)
            + "\n" + real_layout.BASE["pkg/__init__.py"])
    files = {"pkg/__init__.py": init.encode(), **dict(probe.files)}
    if probe.implements:
        files["pkg/core.py"] = IMPLEMENTATION
    before = _tree_hash(base)
    try:
        outcome = evaluator.evaluate(task, (1,), [files])
        [result] = outcome.features
        output = result.run.output
        assert result.run.seconds < LIMITS.wall_seconds + 5.0  # bounded in time
        assert float(result.passed) == probe.expected, output[-3000:]
        assert _tree_hash(base) == before  # the base checkout did not change
        left = _processes(result.run.uid, token)
        # nothing of the run is left
        assert left == [], [open(f"/proc/{pid}/status").read()[:300] for pid in left]
        assert _ipc_objects(result.run.uid) == []
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection reached the host
        _check(probe.check, result, outcome, output, evaluator, task)
    finally:
        server.close()
        escaped = [t for t in targets if os.path.exists(t)]
        for target in escaped:
            os.unlink(target)
    assert escaped == []  # no file appeared outside the run


def _check(what: str, result, outcome, output: str, evaluator: Evaluator, task) -> None:
    if what == "tampered":  # a canary caught it: its other tests claimed success
        assert result.tampered and result.reason == "a canary did not fail", result.reason
    elif what == "not tampered":  # it failed on its own tests, the canaries aside
        assert not result.tampered and result.counts["failed"] >= 1, result.reason
    elif what.startswith("reason "):
        assert result.reason == what.split(" ", 1)[1] and not result.tampered
    elif what == "no fake":  # the real pytest ran: the fake one never did
        assert "FAKE PYTEST" not in output and not result.tampered and result.counts["failed"] >= 1
    elif what == "dropped":
        assert outcome.dropped == (("conftest.py",),) and result.counts["failed"] >= 1
    elif what == "no plugin":  # the change's plugin never loaded
        assert "EVIL PLUGIN LOADED" not in output and result.counts["failed"] >= 1, output[-2000:]
    elif what == "appended":  # run_tests.sh is root's in the jail
        assert _number(output, "APPENDED") == 0, output[-2000:]
    elif what == "ipc":  # made in the run's own IPC namespace, gone with it (checked for every row)
        assert _number(output, "SHMID") >= 0, output[-2000:]
    elif what == "userns":
        assert _number(output, "USERNS") != 0, output[-2000:]
    elif what == "disk":
        assert _number(output, "WROTE") <= LIMITS.disk_bytes, output[-2000:]
    elif what == "memory":
        if not cgroup.available("memory"):
            pytest.skip("no memory cgroup here: the per-process fallback cannot hold a process tree")
        assert _number(output, "ALIVE") < 3, output[-2000:]  # the parent lived to count
    elif what.startswith("status "):
        assert result.run.status == what.split()[1]
    elif what == "processes":
        assert _number(output, "SPAWNED") < LIMITS.processes, output[-2000:]
    elif what == "file":
        assert _number(output, "SIZE") <= LIMITS.file_bytes, output[-2000:]
    elif what == "base":  # and the next episode's empty agent still scores 0
        assert not evaluator.evaluate(task, (1,), [{}]).features[0].passed
    else:
        assert what == "" and not result.tampered


def test_the_package_suite_is_out_of_reach_of_the_visible_tests(hostile):
    task, evaluator, _ = hostile
    code = (f"import glob\nfor p in glob.glob({str(SUITE_DIR)!r} + '/*/feature*/feature.patch') + "
            f"glob.glob({str(task.path)!r} + '/feature*/*.patch'):\n    print(open(p).read())\n"
            "import scope_jax\nprint('IMPORTED', scope_jax.__file__)\n")
    init = code + real_layout.BASE["pkg/__init__.py"]
    output = evaluator.run_tests(task, {"pkg/__init__.py": init.encode()}).result.output
    assert "diff --git" not in output and "IMPORTED" not in output
    assert "No module named 'scope_jax'" in output
