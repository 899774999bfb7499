"""The merge evaluator: hidden tests on the merge, and agents' attempts to pass without the feature."""

import pytest

from scope_jax.envs.cooperbench import sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator, PytestCounts, pytest_counts
from scope_jax.envs.cooperbench.repo import post_images

SUMMARIES = [  # (pytest output, counts)
    ("....\n4 passed in 0.05s\n", PytestCounts(passed=4)),
    ("F.\n=== FAILURES ===\n...\n1 failed, 1 passed, 2 warnings in 0.10s\n",
     PytestCounts(passed=1, failed=1)),
    ("===== 3 passed, 1 skipped in 1.20s =====\n", PytestCounts(passed=3, skipped=1)),
    ("E\n1 error in 0.31s\n", PytestCounts(errors=1)),
    ("2 passed in 0.1s\nnoise\n1 failed, 2 errors in 0.2s\n", PytestCounts(failed=1, errors=2)),
    ("no tests ran in 0.01s\n", None),
    ("Segmentation fault\n", None),
]


@pytest.mark.parametrize("output, counts", SUMMARIES)
def test_pytest_summary(output, counts):
    assert pytest_counts(output) == counts


def _source(task, evaluator, feature_id):
    return post_images(evaluator.repos.base(task), task.feature(feature_id).patch)


def test_deleting_the_tests_and_planting_a_conftest_are_stripped(task, evaluator):
    planted = b"def pytest_collection_modifyitems(items):\n    items.clear()\n"
    seat1 = {"tests/test_commands.py": None, "conftest.py": planted, "linetools/conftest.py": planted}
    outcome = evaluator.evaluate(task, (1, 2), [seat1, {}])
    assert sorted(outcome.dropped[0]) == sorted(seat1) and outcome.merge.status == "empty"
    assert not any(f.passed for f in outcome.features)
    assert all(f.counts.failed >= 1 for f in outcome.features)  # the hidden tests ran and failed


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
    assert (quick.test_runs, quick.cache_hits) == (2, 0)  # a timeout is not cached


def test_test_runs_are_cached_by_tree_and_tests(task, evaluator):
    fresh = Evaluator(evaluator.repos, isolation="process", exact_count=False)
    gold = _source(task, evaluator, 1)
    first = fresh.feature_result(task, 1, gold)
    again = fresh.feature_result(task, 1, dict(reversed(list(gold.items()))))  # the same tree
    assert first.passed and again == first and (fresh.test_runs, fresh.cache_hits) == (1, 1)
    other_tests = fresh.feature_result(task, 2, gold)  # the same tree, the other feature's tests
    changed = dict(gold, **{"linetools/commands.py": gold["linetools/commands.py"] + b"\nX = 1\n"})
    edited = fresh.feature_result(task, 1, changed)
    deleted = fresh.feature_result(task, 1, dict(gold, **{"linetools/commands.py": None}))
    assert not other_tests.passed and edited.passed and not deleted.passed
    assert (fresh.test_runs, fresh.cache_hits) == (4, 1)


# At import: write a pytest summary past pytest's capture (to the saved copy of the output pipe), then exit.
FAKE_PASS = b"""
import os
for fd in range(3, 64):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
            os.write(fd, b"1 passed in 0.01s\\n")
    except OSError:
        pass
os._exit(0)
"""


def test_an_early_exit_with_a_fake_summary_fails_the_exact_count(task, evaluator):
    files = {"linetools/__init__.py": (evaluator.repos.base(task) / "linetools" / "__init__.py").read_bytes()
             + FAKE_PASS}
    result = evaluator.feature_result(task, 1, files)
    assert result.run.ok and result.counts == PytestCounts(passed=1)
    assert not result.passed and result.expected == evaluator.gold_count(task, 1) > 1
    lenient = Evaluator(evaluator.repos, isolation="process", exact_count=False)
    result = lenient.feature_result(task, 1, files)  # without the count check, the canary stops it
    assert result.run.ok and not result.passed and result.tampered and lenient.tampered == 1
