"""The build check of a folder of tasks (our suite by default):

  python -m scope_jax.envs.cooperbench.check [TASKS_DIR] [--isolation=namespaces|process]

For every task: each feature's gold patch applies to the base, touches no test or harness file and
passes its own hidden tests, which fail on the base; combined.patch passes every feature's tests; and for
every pair of features the two gold patches merge (plainly or by union) and the merge passes both. One
row per pair is printed, PASS or FAIL (a pair fails with either feature's gold patch or with its merge),
then a FAIL line per problem; the exit status is 1 when any check fails. No pair at all is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from scope_jax.envs.cooperbench import sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.merge import is_protected
from scope_jax.envs.cooperbench.repo import GitError, Repos, post_images
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import Task, TaskFormatError, load_tasks


@dataclasses.dataclass(frozen=True)
class PairCheck:
    """One pair's row: its gold merge (None: not merged, a gold patch failed) and the problems found."""

    features: tuple[int, int]
    merge_status: str | None
    conflicts: int | None
    passed: tuple[bool, bool] | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class TaskCheck:
    task: str
    pairs: list[PairCheck] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)  # of the task as a whole

    def all_problems(self) -> list[str]:
        return list(dict.fromkeys([*self.problems, *(p for pair in self.pairs for p in pair.problems)]))


def _gold_problems(task: Task, evaluator: Evaluator) -> tuple[dict[int, dict], dict[int, list[str]]]:
    """Each feature's gold post-images (the features whose gold patch checks out) and problems."""
    base = evaluator.repos.base(task)
    golds, problems = {}, {f.id: [] for f in task.features}
    for feature in task.features:
        where = f"{task.name} feature{feature.id}"
        try:
            images = post_images(base, feature.patch)
            evaluator.gold(task, feature.id)
        except (GitError, TaskFormatError) as e:
            problems[feature.id].append(f"{where}: {e}")
            continue
        golds[feature.id] = images
        protected = [path for path in images if is_protected(path)]
        if protected:
            problems[feature.id].append(f"{where}: feature.patch touches test or harness files {protected}")
        if evaluator.feature_result(task, feature.id, {}).passed:
            problems[feature.id].append(f"{where}: the hidden tests pass on the base (they test nothing new)")
    return golds, problems


def check_task(task: Task, evaluator: Evaluator) -> TaskCheck:
    result = TaskCheck(task.name)
    golds, problems = _gold_problems(task, evaluator)
    try:
        combined = post_images(evaluator.repos.base(task), task.combined_patch)
    except GitError as e:
        result.problems.append(f"{task.name} combined.patch: {e}")
    else:
        for feature in task.features:
            if feature.id in golds and not evaluator.feature_result(task, feature.id, combined).passed:
                result.problems.append(f"{task.name}: combined.patch fails feature{feature.id}'s tests")
    for a, b in task.pairs():
        pair_problems = problems[a] + problems[b]
        if a not in golds or b not in golds:
            result.pairs.append(PairCheck((a, b), None, None, None, tuple(pair_problems)))
            continue
        outcome = evaluator.evaluate(task, (a, b), [golds[a], golds[b]])
        passed = tuple(f.passed for f in outcome.features)
        if not outcome.both_passed:
            failing = [f for f, ok in zip((a, b), passed) if not ok]
            pair_problems.append(f"{task.name} f{a}+f{b}: the merged gold patches ({outcome.merge.status}) "
                                 f"fail feature(s) {failing}")
        result.pairs.append(PairCheck((a, b), outcome.merge.status, outcome.merge.conflicts, passed,
                                      tuple(pair_problems)))
    return result


COLUMNS = (  # (header, cell of (task check, pair check))
    ("task", lambda t, p: t.task),
    ("pair", lambda t, p: f"f{p.features[0]}+f{p.features[1]}"),
    ("gold merge", lambda t, p: p.merge_status or "-"),
    ("conflict hunks", lambda t, p: "-" if p.conflicts is None else str(p.conflicts)),
    ("merge passes",
     lambda t, p: "-" if p.passed is None else "/".join("yes" if ok else "NO" for ok in p.passed)),
    ("check", lambda t, p: "PASS" if p.ok else "FAIL"),
)


def table(checks: list[TaskCheck]) -> str:
    """One row per pair checked (there must be one)."""
    rows = [[cell(t, p) for _, cell in COLUMNS] for t in checks for p in t.pairs]
    if not rows:
        raise ValueError("no pair was checked")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _) in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks_dir", nargs="?", default=str(SUITE_DIR))
    parser.add_argument("--isolation", default="namespaces", choices=sandbox.ISOLATIONS)
    args = parser.parse_args(argv)
    try:
        tasks = load_tasks(args.tasks_dir)
    except TaskFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    repos = Repos()
    try:
        evaluator = Evaluator(repos, isolation=args.isolation)
        checks = [check_task(task, evaluator) for task in tasks]
    finally:
        repos.close()
    pairs = sum(len(c.pairs) for c in checks)
    if not pairs:
        print(f"error: no pair of features was checked in {args.tasks_dir}", file=sys.stderr)
        return 1
    print(table(checks))
    problems = [p for c in checks for p in c.all_problems()]
    for problem in problems:
        print(f"FAIL {problem}")
    failed = sum(not p.ok for c in checks for p in c.pairs)
    print(f"{len(tasks)} tasks, {pairs} pairs ({failed} FAIL), isolation {evaluator.isolation}: "
          + (f"{len(problems)} problem(s)" if problems else "all checks pass"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
