"""Test session setup.

- 8 fake CPU devices, so sharded code runs the same on this machine as on a pod.
- LLVM's backend optimisation off (`COMPILE_FAST`): the tests' programs are tiny, so compiling them
  costs far more than running them (docs/testing.md has the measurement).
- One persistent compilation cache per test session (a temporary folder, inherited by the runs the
  tests start as subprocesses): tests build the same tiny models and steps again and again, and each
  identical program is then compiled once. Every program goes into it, however quickly it compiled:
  most of a subprocess run's programs compile in under 0.2 s each (docs/testing.md).
- Under pytest-xdist (setup.cfg: `-n auto --dist loadgroup`) a worker runs each test file whole (its
  module fixtures are built once), and each folder of SHARED_FIXTURE_DIRS whole (their session fixtures,
  a pretrained testbed and the SmolLM2 GGUF, are costly); the costliest groups start first.
- Compiled programs are dropped after a test module once the process holds many memory maps. XLA:CPU
  maps every compiled program into the process; one long session passes the kernel's
  `vm.max_map_count` (65,530 by default) and the next compile aborts the whole run.
"""

import atexit
import gc
import os
import pathlib
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
COMPILE_FAST = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = " ".join(filter(None, (os.environ.get("XLA_FLAGS", ""), COMPILE_FAST,
                                                 "--xla_force_host_platform_device_count=8")))
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="scope-jax-test-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402  (after the environment above)
import pytest  # noqa: E402

TESTS = pathlib.Path(__file__).parent
SHARED_FIXTURE_DIRS = ("models", "testbed")
MAX_MAPS = 20_000  # with room below vm.max_map_count for the largest module's own programs


@pytest.fixture
def qwen3_folders(monkeypatch):
    """The Qwen3 folders that configs name (/models/Qwen3-SIZE) are a GPU machine's: here the checks that a
    model spec names a model take them as present."""
    from scope_jax.envs.tau2 import judge
    from scope_jax.models import hf
    from scope_jax.training import players

    present = lambda spec: spec if "/Qwen3-" in spec else hf.model_path(spec)
    for module in (players, judge):
        monkeypatch.setattr(module, "model_path", present)


@pytest.fixture(params=["0", "1"], ids=["xla-dot", "mkl"])
def matmul_path(request, monkeypatch):
    """The float32 matmuls through XLA's dot, then through MKL (`cpu_gemm`, which must be available on
    x86-64 Linux, where the package depends on MKL; skipped elsewhere)."""
    import platform

    from scope_jax.models import cpu_gemm

    monkeypatch.setenv(cpu_gemm.SWITCH, request.param)
    if request.param == "1" and not cpu_gemm.handler_registered():
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail("cpu_gemm's MKL handler is unavailable (see the logged warning)")
        pytest.skip("no MKL on this platform")
    return request.param


def memory_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    yield
    if os.path.exists("/proc/self/maps") and memory_maps() > MAX_MAPS:
        jax.clear_caches()
        gc.collect()


# The groups that take minutes, costliest first (docs/testing.md). xdist hands groups to the workers in
# collection order (setup.cfg: --no-loadscope-reorder; its default order is by number of tests, which put
# the three-test, six-minute distributed file last), so these start first and the short files fill in
# around them, instead of one worker running a long file alone at the end.
COSTLIEST_FIRST = ("training/test_distributed.py", "testbed", "models", "training/test_large_configs.py",
                   "training/test_loop.py")


def xdist_group(item: pytest.Item) -> str:
    path = pathlib.Path(item.path).relative_to(TESTS)
    return next((d for d in SHARED_FIXTURE_DIRS if path.is_relative_to(d)), str(path))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups: it tags each node id with its group
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    rank = {group: i for i, group in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group(item), len(rank)))  # stable: files stay whole
