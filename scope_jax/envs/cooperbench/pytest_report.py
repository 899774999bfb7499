"""The harness's pytest plugin (loaded with `-p cooperbench_report`; the sandbox copies this file into
the run's site folder under that name): one JSON line per test phase and per failed collection, and one
at the session's end, written to the file descriptor named in COOPERBENCH_REPORT_FD, never to the
output. It runs inside the process under test, so what it writes can be forged; the canaries are what
make a forgery show (canary.py, docs/cooperbench.md). Standard library and pytest only."""

import json
import os

_FD = os.environ.get("COOPERBENCH_REPORT_FD")


def _write(record: dict) -> None:
    if _FD is not None:
        os.write(int(_FD), (json.dumps(record) + "\n").encode())


def pytest_runtest_logreport(report):
    _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail")})


def pytest_collectreport(report):
    if report.failed:
        _write({"nodeid": report.nodeid or "<collection>", "when": "collect", "outcome": "failed",
                "xfail": False})


def pytest_sessionfinish(session, exitstatus):
    _write({"finished": int(exitstatus)})
