"""The suite's build check and the cooperbench_gold job (fast cases on one task; one task per overlap kind
is slow; the whole suite is the job's own check: `python -m scope_jax.envs.cooperbench.check` and the
cooperbench_gold config)."""

import json
import shutil

import pytest

from experiments.jobs import cooperbench_gold as job
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.envs.cooperbench.check import TaskCheck, check_task, main
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import load_task
from scope_jax.training.run_dir import RunDir

# One task per overlap kind of the issue (docs/cooperbench.md, "Our suite"); their gold merges are union
# merges, except for stats (clean).
OVERLAP_KINDS = {"__all__": "validators", "the same function": "markup", "adjacent lines": "settings",
                 "both append to one file": "commands", "a shared helper": "stats"}


@pytest.fixture(scope="module")
def overlap_kinds(tmp_path_factory):
    """A folder of tasks: a copy of one suite task per overlap kind."""
    folder = tmp_path_factory.mktemp("overlap_kinds")
    for name in OVERLAP_KINDS.values():
        shutil.copytree(SUITE_DIR / name, folder / name)
    return folder


def test_check_reports_a_gold_patch_that_fails_its_tests(task_copy, tmp_path):
    other = (task_copy / "feature2" / "feature.patch").read_text()
    (task_copy / "feature1" / "feature.patch").write_text(other)
    repos = Repos(tmp_path / "scratch")
    result = check_task(load_task(task_copy), Evaluator(repos, isolation="process"))
    assert len(result.all_problems()) == 1
    assert "feature1's gold patch does not pass its own tests" in result.all_problems()[0]
    [pair] = result.pairs  # the pair is not merged without both gold patches, and fails
    assert (pair.features, pair.merge_status, pair.ok) == ((1, 2), None, False)


def test_check_prints_every_pair_and_its_failures(task_copy, capsys):
    other = (task_copy / "feature2" / "feature.patch").read_text()
    (task_copy / "feature1" / "feature.patch").write_text(other)
    assert main([str(task_copy.parent), "--isolation=process"]) == 1
    out = capsys.readouterr().out
    assert "commands  f1+f2" in out and out.count("FAIL") >= 2  # the pair's row and its problem line
    assert "FAIL commands feature1: " in out and "1 pairs (1 FAIL)" in out


def test_check_without_pairs_is_a_one_line_error(monkeypatch, task_copy, capsys):
    monkeypatch.setattr("scope_jax.envs.cooperbench.check.check_task",
                        lambda task, evaluator: TaskCheck(task.name))
    assert main([str(task_copy.parent), "--isolation=process"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "no pair of features" in captured.err


@pytest.mark.slow
def test_build_check_passes_on_one_task_per_overlap_kind(overlap_kinds, capsys):
    assert main([str(overlap_kinds)]) == 0
    out = capsys.readouterr().out
    assert "all checks pass" in out and "union" in out and "clean" in out
    assert all(name in out for name in OVERLAP_KINDS.values())


def _config(tasks_dir, **changes):
    config = job.default_config()
    config.update({"tasks_dir": str(tasks_dir), "isolation": "process", **changes})
    return config


def test_config_errors(task_copy, tmp_path):
    for changes, key in (({"agents": ("oracle",)}, "'agents'"), ({"modes": ()}, "'modes'"),
                         ({"isolation": "chroot"}, "'isolation'")):
        with pytest.raises(ConfigError, match=key):
            prepare(_config(task_copy.parent, **changes))
    with pytest.raises(ConfigError, match="config key 'tasks_dir': CooperBench tasks folder .* is missing"):
        prepare(_config(tmp_path / "absent"))


def _run(config, path):
    prepare(config)
    with RunDir.create(path, config) as run_dir:
        job.run(config, run_dir)


def test_job_writes_rewards_merges_and_feature_results(task_copy, tmp_path):
    _run(_config(task_copy.parent, modes=("coop",)), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failures"] == [] and [(r["agent"], r["reward"], r["ok"]) for r in summary["rows"]] == [
        ("gold", 1.0, True), ("empty", 0.0, True)]
    gold = summary["rows"][0]
    assert gold["merge"]["status"] == "union"
    assert [f["passed"] for f in gold["feature_results"]] == [True, True]
    assert "| gold | coop | commands | f1+f2 | union |" in (tmp_path / "run" / "summary.md").read_text()


def test_job_fails_loudly_off_the_expected_reward(task_copy, tmp_path):
    with pytest.raises(SystemExit, match="off their expected reward"):
        _run(_config(task_copy.parent, modes=("solo",), agents=("gold",), test_wall_seconds=0.01),
             tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["failures"]) == 1 and "gold solo commands f1+f2: not played" in summary["failures"][0]
    assert [(r["reward"], r["ok"]) for r in summary["rows"]] == [(None, False)]  # not nan
    assert "**NO**" in (tmp_path / "run" / "summary.md").read_text()


@pytest.mark.slow
def test_gold_job_on_one_task_per_overlap_kind(overlap_kinds, tmp_path):
    _run(_config(overlap_kinds, isolation="namespaces"), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failures"] == [] and len(summary["rows"]) == 4 * len(OVERLAP_KINDS)
    assert {(t["agent"], t["mode"], t["reward"]) for t in summary["totals"]} == {
        ("gold", "coop", 1.0), ("gold", "solo", 1.0), ("empty", "coop", 0.0), ("empty", "solo", 0.0)}


def _scored_row(agent, conflicts, reward):
    rewards = {key: 0.0 for key in job.TOTALS} | {"agent": reward, "naive_conflict": float(conflicts > 0)}
    expected = job._expected(agent, conflicts)
    return {"agent": agent, "mode": "coop", "reward": reward, "rewards": rewards, "expected_reward": expected,
            "ok": expected in (None, reward), "merge": {"conflicts": conflicts}}


def test_coop_gold_on_conflicting_pairs_is_measured_not_expected():
    assert (job._expected("gold", 0), job._expected("gold", 3), job._expected("empty", 3)) == (1.0, None, 0.0)
    rows = [_scored_row("gold", 0, 1.0), _scored_row("gold", 2, 0.0), _scored_row("gold", 1, 1.0)]
    [totals] = job._totals(rows)
    assert all(r["ok"] for r in rows) and totals["off_expected"] == 0 and totals["measured"] == 2
    assert totals["naive_conflict"] == pytest.approx(2 / 3) and totals["reward_on_conflicts"] == 0.5
    assert totals["reward"] == pytest.approx(2 / 3) and totals["errors"] == 0
    assert not _scored_row("gold", 0, 0.0)["ok"]  # a clean pair still must score 1
