"""The merge evaluator: strip the agents' test changes, merge, run both features' hidden tests on the merge.

Every test run follows the upstream runner: a fresh git checkout of the task's base commit (a new clone
of the base checkout, never the base checkout itself), and the task's `run_tests.sh REPO TESTS_PATCH
CHANGE_PATCH` called on it in the sandbox, with the change under test (the merge, or a seat's checkout)
and the feature's hidden tests given as patch files that the script applies itself (after its own
`git reset --hard` and `git clean -fd`, when it has them), the change first. Only the run tree goes into
the sandbox: the checkout, the two patches and a copy of run_tests.sh; the other features' tests and
gold patches are never in it. The visible-tests run passes a tests patch that changes nothing
(VISIBLE_TESTS_PATCH) and no canary.

A feature passes as upstream: the run exits 0 and pytest's summary counts at least one passed test
(and no failures or errors); with `exact_count` (the default) also exactly as many passed tests as the
feature's gold patch gets, measured once per feature and kept. Every scored run's tests patch carries a
canary (canary.py), a test with a random name that must fail; a run where it does not is scored 0 and
counted and logged as tampered. After an unresolved merge conflict no test runs and both features fail.

Test runs are cached by (task folder, digest of the files written over the base, tests patch): the same
tree and tests give the same result, and in a GRPO group many rollouts end with the same tree (often the
base itself). A run that hit the wall clock is not cached (on a loaded machine it may pass the next
time). The cache keeps the `CACHE_ENTRIES` latest results.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import pathlib
import re
import shutil
import tempfile
from typing import Sequence

from scope_jax.envs.cooperbench import canary, sandbox
from scope_jax.envs.cooperbench.merge import MergeResult, merge, source_changes
from scope_jax.envs.cooperbench.repo import Changes, Repos, as_patch, checkout, post_images
from scope_jax.envs.cooperbench.tasks import Task, TaskFormatError

SUMMARY_LINE = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+.* in [\d.]+s\b", re.MULTILINE)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)\b")
OUTPUT_RECORD_CHARS = 2000
CACHE_ENTRIES = 512
# The tests patch of a visible-tests run: it only adds an empty file, so it applies to any checkout.
VISIBLE_TESTS_PATCH = (b"diff --git a/.cooperbench-visible-tests b/.cooperbench-visible-tests\n"
                       b"new file mode 100644\nindex 0000000..e69de29\n")

log = logging.getLogger(__name__)


def tree_digest(files: Changes) -> str:
    """A digest of files written over a base tree (path -> content, None: deleted), in any order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        content = files[path]
        entry = b"-" if content is None else b"+%d\0" % len(content) + content
        digest.update(path.encode() + b"\0" + entry)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class PytestCounts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0


def pytest_counts(output: str) -> PytestCounts | None:
    """The counts of pytest's last summary line ("3 passed, 1 failed in 0.12s"); None without one."""
    lines = SUMMARY_LINE.findall(output)
    if not lines:
        return None
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
              for n, kind in COUNT.findall(lines[-1])}
    return PytestCounts(counts.get("passed", 0), counts.get("failed", 0), counts.get("error", 0),
                        counts.get("skipped", 0))


@dataclasses.dataclass(frozen=True)
class FeatureResult:
    """One feature's hidden tests on a tree. run is None when they were not run (merge conflict)."""

    feature: int
    passed: bool
    run: sandbox.RunResult | None = None
    counts: PytestCounts | None = None
    expected: int | None = None
    tampered: bool = False

    def record(self) -> dict:
        run = self.run
        return {"feature": self.feature, "passed": self.passed, "expected_passed": self.expected,
                "status": run.status if run else "not_run", "exit_code": run.exit_code if run else None,
                "counts": dataclasses.asdict(self.counts) if self.counts else None,
                "tampered": self.tampered, "sandbox_fallbacks": list(run.fallbacks) if run else [],
                "output_tail": run.output[-OUTPUT_RECORD_CHARS:] if run else ""}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The evaluation of one episode: the merge, each feature's result (the pair's order), and the
    protected paths dropped from each seat's changes."""

    merge: MergeResult
    features: tuple[FeatureResult, ...]
    dropped: tuple[tuple[str, ...], ...]

    @property
    def both_passed(self) -> bool:
        return all(f.passed for f in self.features)

    def record(self) -> dict:
        return {"merge": self.merge.record(), "features": [f.record() for f in self.features],
                "dropped": [list(d) for d in self.dropped], "both_passed": self.both_passed}


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """A run of run_tests.sh and the canary planted in it (None: none was)."""

    result: sandbox.RunResult
    canary: str | None


class Evaluator:
    """Runs a task's tests in the sandbox on trees built from the task's base (see the module docstring)."""

    def __init__(self, repos: Repos, limits: sandbox.Limits = sandbox.Limits(), isolation: str = "auto",
                 union: bool = True, exact_count: bool = True):
        self.repos, self.limits, self.union, self.exact_count = repos, limits, union, exact_count
        self.isolation = sandbox.resolve_isolation(isolation)
        self._gold_counts: dict[tuple[str, int], int] = {}
        self._cache: collections.OrderedDict[tuple, TaskRun] = collections.OrderedDict()
        self.test_runs = self.cache_hits = self.tampered = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def run_tests(self, task: Task, files: Changes) -> sandbox.RunResult:
        """The visible tests: run_tests.sh on the base with `files` written over it, no hidden tests."""
        return self._cached_run(task, files, None).result

    def _cached_run(self, task: Task, files: Changes, tests_patch: str | None) -> TaskRun:
        key = (str(task.path), tree_digest(files), tests_patch)
        if key in self._cache:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return self._cache[key]
        run = self._run(task, files, tests_patch)
        self.test_runs += 1
        if run.result.status != "timeout":
            self._cache[key] = run
            if len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return run

    def _run(self, task: Task, files: Changes, tests_patch: str | None) -> TaskRun:
        runs = self.repos.root / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=runs) as work:
            work = pathlib.Path(work)
            checkout(self.repos.base(task), work / "repo")
            change = as_patch(work / "repo", files)
            name = canary.new_name() if tests_patch is not None else None
            tests = (VISIBLE_TESTS_PATCH if tests_patch is None
                     else canary.plant(work / "repo", tests_patch, name))
            if tests is None:
                self._fallback(f"task {task.name}: a tests patch touches no Python test file, so it runs "
                               "without a canary")
                tests, name = tests_patch.encode(), None
            (work / "tests.patch").write_bytes(tests)
            (work / "change.patch").write_bytes(change)
            shutil.copyfile(task.run_tests, work / "run_tests.sh")
            command = ["bash", str(work / "run_tests.sh"), str(work / "repo"), str(work / "tests.patch"),
                       str(work / "change.patch") if change else ""]
            result = sandbox.run(command, work, self.limits, self.isolation,
                                 {"PYTEST_ADDOPTS": canary.PYTEST_OPTIONS})
        for cap in result.fallbacks:
            self.fallbacks[cap] += 1
        return TaskRun(result, name)

    def _fallback(self, what: str) -> None:
        if not self.fallbacks[what]:
            log.warning("cooperbench evaluator: %s (counted in Evaluator.fallbacks)", what)
        self.fallbacks[what] += 1

    def gold_count(self, task: Task, feature_id: int) -> int:
        """How many hidden tests pass with the feature's gold patch (run once, then kept)."""
        key = (task.name, feature_id)
        if key not in self._gold_counts:
            feature = task.feature(feature_id)
            gold = post_images(self.repos.base(task), feature.patch)
            result = self._scored(task, feature_id, gold, None)
            if not result.passed:
                why = ("the canary test was not reported as an expected failure (XFAIL): the run was "
                       "tampered with, or run_tests.sh hides pytest's short summary" if result.tampered
                       else f"{result.run.status}, exit {result.run.exit_code}")
                raise TaskFormatError(f"CooperBench task {task.name}: feature{feature_id}'s gold patch does "
                                      f"not pass its own tests ({why}); run the build check")
            self._gold_counts[key] = result.counts.passed
        return self._gold_counts[key]

    def _scored(self, task: Task, feature_id: int, files: Changes, expected: int | None) -> FeatureResult:
        """The feature's hidden tests on the base with `files`, by the pass rule (module docstring)."""
        run = self._cached_run(task, files, task.feature(feature_id).tests_patch)
        counts = pytest_counts(run.result.output)
        claims = (run.result.ok and counts is not None and counts.passed > 0 and not counts.failed
                  and not counts.errors)
        tampered = run.canary is not None and canary.tampered(run.result.output, run.canary, claims)
        if tampered:
            self.tampered += 1
            log.warning("cooperbench evaluator: task %s feature%d: the canary test did not fail as it must; "
                        "the run is scored 0 as tampered", task.name, feature_id)
        passed = claims and not tampered and expected in (None, counts.passed)
        return FeatureResult(feature_id, passed, run.result, counts, expected, tampered)

    def feature_result(self, task: Task, feature_id: int, files: Changes) -> FeatureResult:
        """The feature's hidden tests on the base tree with `files` (already stripped and merged)."""
        expected = self.gold_count(task, feature_id) if self.exact_count else None
        return self._scored(task, feature_id, files, expected)

    def evaluate(self, task: Task, feature_ids: Sequence[int], seats: Sequence[Changes]) -> Outcome:
        """Strip, merge (seats[1] as ours, seats[0] as theirs; a single seat is taken as is) and test every
        feature in `feature_ids` on the result."""
        stripped = [source_changes(changes) for changes in seats]
        kept = [files for files, _ in stripped]
        base = self.repos.base(task)

        def read_base(path: str) -> bytes | None:
            file = base / path
            return file.read_bytes() if file.is_file() else None

        merged = merge(read_base, kept[1] if len(kept) > 1 else {}, kept[0], union=self.union)
        if merged.status == "conflict":
            results = tuple(FeatureResult(f, False) for f in feature_ids)
        else:
            results = tuple(self.feature_result(task, f, merged.files) for f in feature_ids)
        return Outcome(merged, results, tuple(dropped for _, dropped in stripped))
