"""The merge evaluator: hidden tests on the merge, and agents' attempts to pass without the feature."""

import json

import pytest

from scope_jax.envs.cooperbench import sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator, Report, check_paths, parse_report
from scope_jax.envs.cooperbench.repo import post_images


def _lines(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _phase(nodeid, when, outcome, xfail=False):
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "xfail": xfail}


REPORTS = [  # (the plugin's lines, each item's outcome), written by hand from pytest's phase rules
    (_lines(_phase("a", "setup", "passed"), _phase("a", "call", "passed"), _phase("a", "teardown", "passed"),
            _phase("b", "setup", "passed"), _phase("b", "call", "failed"), _phase("b", "teardown", "passed"),
            {"finished": 1}), Report({"a": "passed", "b": "failed"}, True)),
    (_lines(_phase("a", "setup", "failed"), _phase("a", "teardown", "passed"), _phase("b", "setup", "skipped"),
            _phase("c", "setup", "passed"), _phase("c", "call", "passed"), _phase("c", "teardown", "failed")),
     Report({"a": "error", "b": "skipped", "c": "error"}, False)),
    (_lines(_phase("a", "setup", "passed"), _phase("a", "call", "skipped", True),
            _phase("b", "setup", "passed"), _phase("b", "call", "passed", True),
            _phase("t.py", "collect", "failed"), {"finished": 2}),
     Report({"a": "xfailed", "b": "xpassed", "t.py": "error"}, True)),
    (_lines(_phase("a", "setup", "passed")), Report({"a": "error"}, False)),  # it never got to its call
    (b"2 passed in 0.01s\n", None),  # not the plugin's
    (b'{"finished": ' + b"9" * 5000 + b"}\n", None),  # json.loads raises ValueError, not JSONDecodeError
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", None),  # ... and RecursionError
    (b"", Report({}, False)),
    (None, None),
]


@pytest.mark.parametrize("data, report", REPORTS, ids=range(len(REPORTS)))
def test_report(data, report):
    assert parse_report(data) == report


@pytest.mark.parametrize("path", ["../x.py", "{tmp}/absolute.py", "pkg/../../x.py", "pkg//x.py", "./x.py", "",
                                  "sub/.git/config", ".git/HEAD"])
def test_paths_that_leave_the_repository_are_refused(task, evaluator, path, tmp_path):
    path = path.format(tmp=tmp_path)  # never a real file: without the check, this one is written
    with pytest.raises(ValueError, match="leaves the repository"):
        check_paths({path: b"x"})
    with pytest.raises(ValueError, match="leaves the repository"):
        evaluator.evaluate(task, (1,), [{path: b"x"}])
    check_paths({"pkg/x.py": b"x", "x.py": None})


def _source(task, evaluator, feature_id):
    return post_images(evaluator.repos.base(task), task.feature(feature_id).patch)


def test_deleting_the_tests_and_planting_a_conftest_are_stripped(task, evaluator):
    planted = b"def pytest_collection_modifyitems(items):\n    items.clear()\n"
    seat1 = {"tests/test_commands.py": None, "conftest.py": planted, "linetools/conftest.py": planted}
    outcome = evaluator.evaluate(task, (1, 2), [seat1, {}])
    assert sorted(outcome.dropped[0]) == sorted(seat1) and outcome.merge.status == "empty"
    assert not any(f.passed for f in outcome.features)
    assert all(f.counts["failed"] >= 1 for f in outcome.features)  # the hidden tests ran and failed


def test_unresolved_conflict_fails_without_running_tests(task, evaluator):
    outcome = evaluator.evaluate(task, (1, 2), [{"linetools/commands.py": None},
                                                {"linetools/commands.py": b"COMMANDS = {}\n"}])
    assert outcome.merge.status == "conflict"
    assert [(f.passed, f.run) for f in outcome.features] == [(False, None), (False, None)]


def test_endless_import_is_a_failure(task, evaluator):
    quick = Evaluator(evaluator.repos, sandbox.Limits(wall_seconds=3.0), isolation="process",
                      exact_count=False)
    files = _source(task, evaluator, 1)
    files["linetools/commands.py"] += b"\nwhile True:\n    pass\n"
    for _ in range(2):
        result = quick.feature_result(task, 1, files)
        assert not result.passed and result.run.status == "timeout"
    assert (quick.test_runs, quick.cache_hits) == (3, 0)  # the gold run, then two timeouts (never cached)


def test_test_runs_are_cached_by_tree_and_tests(task, evaluator):
    fresh = Evaluator(evaluator.repos, isolation="process", exact_count=False)
    gold = _source(task, evaluator, 1)
    first = fresh.feature_result(task, 1, gold)
    again = fresh.feature_result(task, 1, dict(reversed(list(gold.items()))))  # the same tree
    assert first.passed and again == first and (fresh.test_runs, fresh.cache_hits) == (2, 1)  # gold run too
    other_tests = fresh.feature_result(task, 2, gold)  # the same tree, the other feature's tests
    changed = dict(gold, **{"linetools/commands.py": gold["linetools/commands.py"] + b"\nX = 1\n"})
    edited = fresh.feature_result(task, 1, changed)
    deleted = fresh.feature_result(task, 1, dict(gold, **{"linetools/commands.py": None}))
    assert not other_tests.passed and edited.passed and not deleted.passed
    assert (fresh.test_runs, fresh.cache_hits) == (6, 1)  # 2 gold runs, 4 scored runs
