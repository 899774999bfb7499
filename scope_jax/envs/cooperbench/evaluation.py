"""The merge evaluator: strip the agents' test changes, merge, run both features' hidden tests on the merge.

Every test run copies the task's base tree (plus the files under test) into a fresh folder and calls the
task's run_tests.sh there, in the sandbox. A feature passes when the run exits 0 and pytest's summary
counts no failures or errors and at least one passed test, and (with `exact_count`, the default) exactly
as many passed tests as the feature's gold patch gets: code that exits early, skips collection or prints
a fake summary does not pass. The gold counts are measured once per feature and kept. After an unresolved
merge conflict no test runs and both features fail.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tempfile
from typing import Sequence

from scope_jax.envs.cooperbench import sandbox
from scope_jax.envs.cooperbench.merge import MergeResult, merge, source_changes
from scope_jax.envs.cooperbench.repo import Changes, Repos, export_tree
from scope_jax.envs.cooperbench.tasks import Task, TaskFormatError

SUMMARY_LINE = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+.* in [\d.]+s\b", re.MULTILINE)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)\b")
OUTPUT_RECORD_CHARS = 2000


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

    def record(self) -> dict:
        run = self.run
        return {"feature": self.feature, "passed": self.passed, "expected_passed": self.expected,
                "status": run.status if run else "not_run", "exit_code": run.exit_code if run else None,
                "counts": dataclasses.asdict(self.counts) if self.counts else None,
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


class Evaluator:
    """Runs a task's tests in the sandbox on trees built from the task's base (see the module docstring)."""

    def __init__(self, repos: Repos, limits: sandbox.Limits = sandbox.Limits(), isolation: str = "auto",
                 union: bool = True, exact_count: bool = True):
        self.repos, self.limits, self.union, self.exact_count = repos, limits, union, exact_count
        self.isolation = sandbox.resolve_isolation(isolation)
        self._gold_counts: dict[tuple[str, int], int] = {}

    def run_tests(self, task: Task, files: Changes, tests_patch: str | None = None,
                  feature_patch: str | None = None) -> sandbox.RunResult:
        """run_tests.sh on the base tree with `files` written over it, then the patches applied by it."""
        runs = self.repos.root / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=runs) as work:
            work = pathlib.Path(work)
            export_tree(self.repos.base(task), work / "repo", files)
            args = []
            for name, patch in (("tests.patch", tests_patch), ("feature.patch", feature_patch)):
                if patch is not None:
                    (work / name).write_text(patch)
                args.append(str(work / name) if patch is not None else "")
            command = ["bash", str(task.run_tests.resolve()), str(work / "repo"), *args]
            return sandbox.run(command, work, self.limits, self.isolation)

    def gold_count(self, task: Task, feature_id: int) -> int:
        """How many hidden tests pass with the feature's gold patch (run once, then kept)."""
        key = (task.name, feature_id)
        if key not in self._gold_counts:
            feature = task.feature(feature_id)
            run = self.run_tests(task, {}, feature.tests_patch, feature.patch)
            counts = pytest_counts(run.output)
            if not run.ok or counts is None or counts.passed == 0 or counts.failed or counts.errors:
                raise TaskFormatError(f"CooperBench task {task.name}: feature{feature_id}'s gold patch does "
                                      f"not pass its own tests ({run.status}, exit {run.exit_code}); run the "
                                      "build check")
            self._gold_counts[key] = counts.passed
        return self._gold_counts[key]

    def feature_result(self, task: Task, feature_id: int, files: Changes) -> FeatureResult:
        """The feature's hidden tests on the base tree with `files` (already stripped and merged)."""
        run = self.run_tests(task, files, task.feature(feature_id).tests_patch)
        counts = pytest_counts(run.output)
        expected = self.gold_count(task, feature_id) if self.exact_count else None
        passed = (run.ok and counts is not None and counts.passed > 0 and not counts.failed
                  and not counts.errors and expected in (None, counts.passed))
        return FeatureResult(feature_id, passed, run, counts, expected)

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
