"""The suite's build check and the cooperbench_gold job (fast cases on one task; the whole suite is slow)."""

import json
import pathlib
import subprocess
import sys

import pytest

from experiments.jobs import cooperbench_gold as job
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.envs.cooperbench.check import check_task, main
from scope_jax.envs.cooperbench.evaluation import Evaluator
from scope_jax.envs.cooperbench.repo import Repos
from scope_jax.envs.cooperbench.tasks import load_task
from scope_jax.training.run_dir import RunDir

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_check_reports_a_gold_patch_that_fails_its_tests(task_copy, tmp_path):
    other = (task_copy / "feature2" / "feature.patch").read_text()
    (task_copy / "feature1" / "feature.patch").write_text(other)
    repos = Repos(tmp_path / "scratch")
    result = check_task(load_task(task_copy), Evaluator(repos, isolation="process"))
    assert len(result.problems) == 1
    assert "feature1's gold patch does not pass its own tests" in result.problems[0]
    assert result.pairs == []  # no pair is checked without both gold patches


@pytest.mark.slow
def test_build_check_passes_on_the_suite(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "all checks pass" in out and "union" in out and "clean" in out


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
        _run(_config(task_copy.parent, modes=("coop",), agents=("gold",), test_wall_seconds=0.01),
             tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["failures"]) == 1 and "expected 1" in summary["failures"][0]
    assert "**NO**" in (tmp_path / "run" / "summary.md").read_text()


@pytest.mark.slow
def test_gold_job_on_the_whole_suite(tmp_path):
    workdir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "experiments.run",
                    "--config=experiments/configs/cooperbench_gold.py", f"--workdir={workdir}"],
                   cwd=ROOT, check=True, capture_output=True, timeout=1200)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["failures"] == [] and len(summary["rows"]) == 4 * 9
    assert {(t["agent"], t["mode"], t["reward"]) for t in summary["totals"]} == {
        ("gold", "coop", 1.0), ("gold", "solo", 1.0), ("empty", "coop", 0.0), ("empty", "solo", 0.0)}
