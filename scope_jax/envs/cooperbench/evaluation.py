"""The merge evaluator: strip the agents' test changes, merge, run both features' hidden tests on the merge.

Every test run follows the upstream runner: a fresh git checkout of the task's base commit (a new clone
of the base checkout, never the base checkout itself), and the task's `run_tests.sh REPO TESTS_PATCH
CHANGE_PATCH` called on it in the sandbox, with the change under test (the merge, or a seat's checkout)
and the feature's hidden tests given as patch files that the script applies itself (after its own
`git reset --hard` and `git clean -fd`, when it has them), the change first. Only the run tree goes into
the sandbox: the checkout (the only part the run may write), the two patches, a copy of run_tests.sh
and the harness's pytest files; the other features' tests and gold patches are never in it. The
visible-tests run passes a tests patch that changes nothing (VISIBLE_TESTS_PATCH) and no canary.

pytest runs as the harness says, whatever the task's script passes (PYTEST_ADDOPTS): the base's own
pytest configuration file named with `-c` (or an empty one of the harness's), `--rootdir` the checkout,
no cache, plugin autoload off, and only the plugins named (`pytest_plugins`) and the harness's report
plugin (pytest_report.py), which writes each test's outcome to a pipe of its own. The repository's
conftest.py files still run.

The verdict comes from that report, never from the output: a feature passes when every test of its
tests patch has the outcome it has with the gold patch (the same count per outcome; without
`exact_count`: at least one passed and none failed), and every canary planted in the run (canary.py:
copies of the hidden tests with one assertion changed, checked once to fail on the gold patch) failed.
The report is written by the process under test and so can be forged; a forgery that turns failures
into passes must spare each canary without knowing which of two near-identical tests it is, and a run
whose canary did not fail while its other tests claim success is scored 0 and counted as tampered
(docs/cooperbench.md). After an unresolved merge conflict no test runs and both features fail.

Test runs are cached by (task folder, digest of the files written over the base, tests patch): the same
tree and tests give the same result, and in a GRPO group many rollouts end with the same tree (often the
base itself). A run that hit the wall clock is not cached (on a loaded machine it may pass the next
time). The cache keeps the `CACHE_ENTRIES` latest results.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import pathlib
import posixpath
import random
import secrets
import shutil
import tempfile
from typing import Sequence

from scope_jax.envs.cooperbench import canary, sandbox
from scope_jax.envs.cooperbench.merge import MergeResult, merge, source_changes
from scope_jax.envs.cooperbench.repo import Changes, Repos, as_patch, checkout, post_images
from scope_jax.envs.cooperbench.tasks import Task, TaskFormatError

OUTPUT_RECORD_CHARS = 2000
CACHE_ENTRIES = 512
CANARIES = 3  # canaries planted per scored run (fewer where fewer mutants fail on the gold patch)
# The tests patch of a visible-tests run: it only adds an empty file, so it applies to any checkout.
VISIBLE_TESTS_PATCH = (b"diff --git a/.cooperbench-visible-tests b/.cooperbench-visible-tests\n"
                       b"new file mode 100644\nindex 0000000..e69de29\n")
REPORT_PLUGIN = "cooperbench_report"
REPORT_SOURCE = pathlib.Path(__file__).with_name("pytest_report.py")
HARNESS_INI = "harness-pytest.ini"  # the empty configuration used where the base has none
# pytest's configuration files, in the order it looks for them in a folder, with the section that makes
# a pyproject.toml, tox.ini or setup.cfg one ("": any such file is one).
PYTEST_CONFIGS = (("pytest.ini", ""), (".pytest.ini", ""), ("pyproject.toml", "[tool.pytest"),
                  ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]"))
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")

log = logging.getLogger(__name__)


def tree_digest(files: Changes) -> str:
    """A digest of files written over a base tree (path -> content, None: deleted), in any order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        content = files[path]
        entry = b"-" if content is None else b"+%d\0" % len(content) + content
        digest.update(path.encode() + b"\0" + entry)
    return digest.hexdigest()


def check_paths(files: Changes) -> None:
    """Refuse, in one line, a path that is not a plain relative path inside the repository."""
    for path in files:
        parts = path.split("/")
        if (not path or path.startswith("/") or posixpath.normpath(path) != path
                or any(part in ("", ".", "..", ".git") for part in parts)):
            raise ValueError(f"cooperbench evaluate: the path {path!r} leaves the repository or enters .git")


@dataclasses.dataclass(frozen=True)
class Report:
    """The report plugin's record of a run: each test item's outcome, and whether the session ended."""

    outcomes: dict[str, str]
    finished: bool


def parse_report(data: bytes | None) -> Report | None:
    """The outcome of each test item (passed, failed, error, skipped, xfailed, xpassed) from the report
    plugin's lines; None when there is no report or a line is not one of the plugin's (the process under test
    can write any bytes there: whatever they are, they give None, never an exception)."""
    if data is None:
        return None
    outcomes, finished = {}, False
    try:
        for line in data.decode().splitlines():
            record = json.loads(line)
            if "finished" in record:
                finished = True
                continue
            nodeid, when, outcome, xfail = record["nodeid"], record["when"], record["outcome"], record["xfail"]
            if when in ("setup", "collect"):
                outcomes[nodeid] = ("error" if outcome == "failed" else
                                    ("xfailed" if xfail else "skipped") if outcome == "skipped" else "error")
            elif when == "call":
                outcomes[nodeid] = ("failed" if outcome == "failed" else
                                    ("xfailed" if xfail else "skipped") if outcome == "skipped" else
                                    "xpassed" if xfail else "passed")
            elif when == "teardown" and outcome == "failed":
                outcomes[nodeid] = "error"
    # ValueError: bad UTF-8, bad JSON, or an integer too long to read; RecursionError: nesting too deep
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None
    return Report(outcomes, finished)


def counts(outcomes) -> dict[str, int]:
    """Items per outcome, every outcome listed."""
    found = collections.Counter(outcomes)
    return {outcome: found[outcome] for outcome in OUTCOMES}


@dataclasses.dataclass(frozen=True)
class Gold:
    """A feature's tests on its gold patch: the count per outcome, and the mutants that fail there."""

    counts: dict[str, int]
    mutants: tuple[canary.Mutant, ...]


@dataclasses.dataclass(frozen=True)
class FeatureResult:
    """One feature's hidden tests on a tree. run is None when they were not run (merge conflict); counts:
    the items per outcome of the feature's own tests (canaries apart); reason: why it failed, one line."""

    feature: int
    passed: bool
    run: sandbox.RunResult | None = None
    counts: dict[str, int] | None = None
    expected: dict[str, int] | None = None
    tampered: bool = False
    canaries: int = 0
    reason: str = ""

    def record(self) -> dict:
        run = self.run
        return {"feature": self.feature, "passed": self.passed, "reason": self.reason,
                "expected": self.expected, "status": run.status if run else "not_run",
                "exit_code": run.exit_code if run else None, "counts": self.counts, "canaries": self.canaries,
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
    """A run of run_tests.sh, its parsed report, and each test function renamed by the canaries planted
    in it: its mutant (None: the original; empty: none were planted)."""

    result: sandbox.RunResult
    report: Report | None
    roles: dict[str, canary.Mutant | None]


class Evaluator:
    """Runs a task's tests in the sandbox on trees built from the task's base (see the module docstring)."""

    def __init__(self, repos: Repos, limits: sandbox.Limits = sandbox.Limits(), isolation: str = "namespaces",
                 union: bool = True, exact_count: bool = True, pytest_plugins: Sequence[str] = ()):
        self.repos, self.limits, self.union, self.exact_count = repos, limits, union, exact_count
        self.pytest_plugins = tuple(pytest_plugins)
        self.isolation = sandbox.resolve_isolation(isolation)
        self._gold: dict[tuple[str, int], Gold] = {}
        self._cache: collections.OrderedDict[tuple, TaskRun] = collections.OrderedDict()
        self.test_runs = self.cache_hits = self.tampered = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def run_tests(self, task: Task, files: Changes) -> TaskRun:
        """The visible tests: run_tests.sh on the base with `files` written over it, no hidden tests."""
        return self._cached_run(task, files, None, (), every_mutant=False)

    def _cached_run(self, task: Task, files: Changes, tests_patch: str | None, mutants: Sequence[canary.Mutant],
                    every_mutant: bool) -> TaskRun:
        """A run with every one of `mutants` planted, or (a scored run) CANARIES of them drawn anew."""
        key = (str(task.path), tree_digest(files), tests_patch, every_mutant)
        if key in self._cache:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return self._cache[key]
        plant = list(mutants) if every_mutant else _choose(mutants, random.Random(secrets.randbits(64)))
        run = self._run(task, files, tests_patch, plant)
        self.test_runs += 1
        if run.result.status != "timeout":
            self._cache[key] = run
            if len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return run

    def _pytest_options(self, work: pathlib.Path) -> str:
        """The harness's pytest options: the base's own configuration file (else an empty one), the
        checkout as rootdir, no cache, the report plugin and the named plugins."""
        repo = work / "repo"
        config = next((repo / name for name, section in PYTEST_CONFIGS if (repo / name).is_file()
                       and section in (repo / name).read_text(errors="replace")), None)
        if config is None:
            config = work / HARNESS_INI
            config.write_text("[pytest]\n")
        plugins = " ".join(f"-p {name}" for name in (REPORT_PLUGIN, *self.pytest_plugins))
        return f"-c {config} --rootdir={repo} -p no:cacheprovider {plugins}"

    def _run(self, task: Task, files: Changes, tests_patch: str | None,
             plant: Sequence[canary.Mutant]) -> TaskRun:
        runs = self.repos.root / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=runs) as work:
            work = pathlib.Path(work)
            checkout(self.repos.base(task), work / "repo")
            change = as_patch(work / "repo", files)
            roles: dict[str, canary.Mutant | None] = {}
            if tests_patch is None:
                tests = VISIBLE_TESTS_PATCH
            else:
                tests_files = post_images(work / "repo", tests_patch)
                planted, roles = canary.plant(tests_files, list(plant))
                tests = as_patch(work / "repo", {**tests_files, **planted})
            (work / "tests.patch").write_bytes(tests)
            (work / "change.patch").write_bytes(change)
            shutil.copyfile(task.run_tests, work / "run_tests.sh")
            command = ["bash", str(work / "run_tests.sh"), str(work / "repo"), str(work / "tests.patch"),
                       str(work / "change.patch") if change else ""]
            env = {"PYTEST_ADDOPTS": self._pytest_options(work), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
            result = sandbox.run(command, work, self.limits, self.isolation, env, writable=("repo",),
                                 site_modules={f"{REPORT_PLUGIN}.py": REPORT_SOURCE.read_text()}, report=True)
        for cap in result.fallbacks:
            self.fallbacks[cap] += 1
        return TaskRun(result, parse_report(result.report), roles)

    def _fallback(self, what: str) -> None:
        if not self.fallbacks[what]:
            log.warning("cooperbench evaluator: %s (counted in Evaluator.fallbacks)", what)
        self.fallbacks[what] += 1

    def gold(self, task: Task, feature_id: int) -> Gold:
        """The feature's tests on its gold patch, with every mutant of them planted (run once, then kept):
        the count per outcome of its own tests, and the mutants whose every item fails there."""
        key = (task.name, feature_id)
        if key not in self._gold:
            feature, base = task.feature(feature_id), self.repos.base(task)
            tests_files = post_images(base, feature.tests_patch)
            before = {path: (base / path).read_bytes() if (base / path).is_file() else None for path in tests_files}
            mutants = canary.mutants(tests_files, before, secrets.randbits(64))
            run = self._cached_run(task, post_images(base, feature.patch), feature.tests_patch, mutants,
                                   every_mutant=True)
            own, items = _split(run)
            problem = _gold_problem(run, own)
            if problem:
                raise TaskFormatError(f"CooperBench task {task.name}: feature{feature_id}'s gold patch does not "
                                      f"pass its own tests ({problem}); run the build check")
            failing = tuple(m for m, names in zip(mutants, _mutant_names(run, mutants)) if _failed(names, items))
            if not failing:
                self._fallback(f"task {task.name} feature{feature_id}: no mutant of its tests fails on the gold "
                               "patch, so its runs have no canary (the exact count still holds)")
            self._gold[key] = Gold(counts(own.values()), failing)
        return self._gold[key]

    def _scored(self, task: Task, feature_id: int, files: Changes, gold: Gold) -> FeatureResult:
        """The feature's hidden tests on the base with `files`, by the pass rule (module docstring)."""
        run = self._cached_run(task, files, task.feature(feature_id).tests_patch, gold.mutants,
                               every_mutant=False)
        chosen = [mutant for mutant in run.roles.values() if mutant is not None]
        own, items = _split(run)
        found = counts(own.values()) if run.report else None
        claims = found is not None and found["passed"] > 0 and not found["failed"] and not found["error"]
        canaries_failed = all(_failed(names, items) for names in _mutant_names(run, chosen))
        expected = gold.counts if self.exact_count else None
        reason = (f"sandbox {run.result.status}" if run.result.status != "exited" else
                  "no complete test report" if run.report is None or not run.report.finished else
                  "a test failed or none passed" if not claims else
                  "a canary did not fail" if not canaries_failed else
                  f"counts {found} differ from the gold run's {expected}" if expected not in (None, found) else "")
        tampered = claims and not canaries_failed
        if tampered:
            self.tampered += 1
            log.warning("cooperbench evaluator: task %s feature%d: a canary did not fail while the other tests "
                        "passed; the run is scored 0 as tampered", task.name, feature_id)
        return FeatureResult(feature_id, not reason, run.result, found, expected, tampered, len(chosen), reason)

    def feature_result(self, task: Task, feature_id: int, files: Changes) -> FeatureResult:
        """The feature's hidden tests on the base tree with `files` (already stripped and merged)."""
        return self._scored(task, feature_id, files, self.gold(task, feature_id))

    def evaluate(self, task: Task, feature_ids: Sequence[int], seats: Sequence[Changes]) -> Outcome:
        """Strip, merge (seats[1] as ours, seats[0] as theirs; a single seat is taken as is) and test every
        feature in `feature_ids` on the result. A path that leaves the repository is refused."""
        for changes in seats:
            check_paths(changes)
        stripped = [source_changes(changes) for changes in seats]
        kept = [files for files, _ in stripped]
        base = self.repos.base(task)

        def read_base(path: str) -> bytes | None:
            file = base / path
            return file.read_bytes() if file.is_file() else None

        merged = merge(read_base, kept[1] if len(kept) > 1 else {}, kept[0], union=self.union)
        if merged.status == "conflict":
            results = tuple(FeatureResult(f, False, reason="unresolved merge conflict") for f in feature_ids)
        else:
            results = tuple(self.feature_result(task, f, merged.files) for f in feature_ids)
        return Outcome(merged, results, tuple(dropped for _, dropped in stripped))


def _choose(mutants: Sequence[canary.Mutant], rng: random.Random) -> list[canary.Mutant]:
    """CANARIES of `mutants` at random, spread over as many test functions as there are."""
    by_function = collections.defaultdict(list)
    for mutant in mutants:
        by_function[mutant.path, mutant.function].append(mutant)
    groups = [rng.sample(group, len(group)) for group in by_function.values()]
    rng.shuffle(groups)
    spread = [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
    return spread[:CANARIES]


def _split(run: TaskRun) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the outcome of each item of the feature's own tests, the outcomes of each renamed test function's
    items); the originals of planted canaries count among the own tests."""
    own, items = {}, collections.defaultdict(list)
    for nodeid, outcome in (run.report.outcomes.items() if run.report else ()):
        function = canary.function_name(nodeid)
        items[function].append(outcome)
        if run.roles.get(function) is None:
            own[nodeid] = outcome
    return own, items


def _mutant_names(run: TaskRun, mutants: Sequence[canary.Mutant]) -> list[list[str]]:
    """For each mutant, the names it was planted under."""
    return [[name for name, planted in run.roles.items() if planted == mutant] for mutant in mutants]


def _failed(names: list[str], items: dict[str, list[str]]) -> bool:
    """Whether the test functions `names` ran and every item of them failed."""
    return bool(names) and all(items.get(n) and all(o == "failed" for o in items[n]) for n in names)


def _gold_problem(run: TaskRun, own: dict[str, str]) -> str:
    """Why a gold run does not pass (empty: it does)."""
    found = counts(own.values())
    if run.result.status != "exited":
        return f"sandbox {run.result.status}"
    if run.report is None or not run.report.finished:
        return "no complete test report (run_tests.sh did not run pytest?)"
    if found["failed"] or found["error"] or not found["passed"]:
        return f"counts {found}"
    return ""
