"""Scoring a task in the real layout (real_layout.py: a bundle, upstream-style run_tests.sh with its reset
and clean, conflicting features) by the upstream rule."""

import json

import pytest

from experiments.jobs import cooperbench_gold as job
from experiments.run import prepare
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos, post_images
from scope_jax.envs.cooperbench.tasks import load_tasks
from scope_jax.training.run_dir import RunDir
from tests.envs.cooperbench import real_layout


@pytest.fixture(scope="module")
def real_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_layout")
    real_layout.build(root)
    [task] = load_tasks(root / "demo_task")
    return task


@pytest.fixture(scope="module")
def real_evaluator():
    repos = Repos()
    yield Evaluator(repos)
    repos.close()


def _passes(evaluator, task, *seats):
    return [f.passed for f in evaluator.evaluate(task, (1, 2), list(seats)).features]


def test_gold_empty_and_each_feature_alone(real_task, real_evaluator):
    base = real_evaluator.repos.base(real_task)
    gold = {f: post_images(base, real_task.feature(f).patch) for f in (1, 2)}
    assert _passes(real_evaluator, real_task, post_images(base, real_task.combined_patch)) == [True, True]
    assert _passes(real_evaluator, real_task, {}) == [False, False]
    assert _passes(real_evaluator, real_task, gold[1]) == [True, False]
    assert _passes(real_evaluator, real_task, gold[2]) == [False, True]
    coop = real_evaluator.evaluate(real_task, (1, 2), [gold[1], gold[2]])
    assert coop.merge.conflicts > 0 and coop.merge.status == "union" and not coop.both_passed
    assert real_evaluator.tampered == 0


def test_the_runs_apply_the_change_after_the_scripts_reset(real_task, real_evaluator):
    result = real_evaluator.feature_result(real_task, 1, post_images(real_evaluator.repos.base(real_task),
                                                                     real_task.combined_patch))
    output = result.run.output
    assert "HEAD is now at" in output  # the script's reset ran on a git checkout
    assert result.passed and result.counts["passed"] == result.expected["passed"] == 2


def test_visible_tests_on_a_real_layout_task(real_task, real_evaluator):
    run = real_evaluator.run_tests(real_task, {"pkg/core.py": b"def greet(name):\n    return 'hi'\n"})
    assert run.result.exit_code == 1 and run.report.outcomes == {"tests/test_core.py::test_greet": "failed"}
    assert "test_shout" not in run.result.output and "test_punct" not in run.result.output  # no hidden tests
    assert real_evaluator.run_tests(real_task, {}).result.ok


@pytest.mark.slow  # 16 sandboxed runs; test_check_and_job.py checks the same rule on rows
def test_gold_job_measures_coop_gold_on_conflicting_pairs(real_task, tmp_path):
    config = job.default_config()
    config.tasks_dir = str(real_task.path.parent)
    prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        job.run(config, run_dir)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = {(r["agent"], r["mode"]): r for r in summary["rows"]}
    assert summary["failures"] == [] and len(rows) == 4
    coop_gold = rows["gold", "coop"]
    assert (coop_gold["reward"], coop_gold["expected_reward"], coop_gold["ok"]) == (0.0, None, True)
    assert (rows["gold", "solo"]["reward"], rows["empty", "coop"]["reward"]) == (1.0, 0.0)
    totals = {(t["agent"], t["mode"]): t for t in summary["totals"]}
    assert totals["gold", "coop"]["naive_conflict"] == 1.0 and totals["gold", "coop"]["measured"] == 1
    assert totals["gold", "coop"]["reward_on_conflicts"] == 0.0 and totals["gold", "coop"]["errors"] == 0
    assert "| gold | coop | task1 | f1+f2 | union | 1 | yes/no | 0 | measured | yes |" in (
        tmp_path / "run" / "summary.md").read_text()
