"""The test session's own setup (tests/conftest.py)."""

import os

import pytest

from tests.conftest import xdist_group


def test_xdist_keeps_each_group_on_one_worker(request):
    # xdist's loadgroup schedules by a suffix it adds to each node id in its own collection hook, from the
    # group marker tests/conftest.py adds: added after that hook, the marker is ignored and a file's tests
    # (with its module and session fixtures) are spread over the workers
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("needs the suite's xdist workers (setup.cfg)")
    assert request.node.nodeid.endswith("@" + xdist_group(request.node)), request.node.nodeid
