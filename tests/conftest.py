"""Test session setup: 8 fake CPU devices, so sharded code runs the same on this machine as on a pod.

Compiled programs are dropped after each test module. XLA:CPU maps every compiled program into the
process; one long session of several thousand programs passes the kernel's `vm.max_map_count`
(65,530 by default) and the next compile aborts the whole run.

Under pytest-xdist (the default `-n auto`, see setup.cfg) each worker takes whole groups: a directory
whose conftest holds session-scoped fixtures (built once per worker that runs it), otherwise a file.
"""

import gc
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

TESTS = Path(__file__).parent
SESSION_FIXTURE_DIRS = ("training", "testbed", "models", "envs/tau2", "envs/cooperbench")


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    yield
    jax.clear_caches()
    gc.collect()


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(item.path).relative_to(TESTS)
        group = next((d for d in SESSION_FIXTURE_DIRS if path.is_relative_to(d)), str(path))
        item.add_marker(pytest.mark.xdist_group(group))
