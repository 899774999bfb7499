"""The tau2_replay job: every gold hash reproduced through the environment, and a mismatch reported loudly
(here one planted in a copy of the sheet's reference) after summary.json is written; a data folder that does
not hold the domains is refused before any work."""

import json
import pathlib
import runpy

import ml_collections
import pytest

from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.training.run_dir import RunDir
from tests.envs.tau2.conftest import DATA, REFERENCE, ROOT


def replay_config(data_dir: pathlib.Path) -> ml_collections.ConfigDict:
    config = runpy.run_path(str(ROOT / "experiments" / "configs" / "tau2_replay.py"))["get_config"]()
    config.data_dir, config.reference = str(data_dir), str(ROOT / config.reference)
    return config


@pytest.mark.parametrize("domains", [("retail", "mock"), ("mock",)])
def test_a_missing_data_folder_is_one_line_naming_data_dir(tmp_path, domains):
    config = replay_config(tmp_path / "absent")
    config.domains = domains
    expected = rf"^config key 'data_dir': tau2 domain folder .*absent/domains/{domains[0]} is missing$"
    with pytest.raises(ConfigError, match=expected):
        prepare(config)


def test_a_malformed_domain_file_is_one_line_naming_data_dir(tmp_path):
    tasks = tmp_path / "domains" / "mock" / "tasks.json"
    tasks.parent.mkdir(parents=True)
    tasks.write_text("[")
    config = replay_config(tmp_path)
    config.domains = ("mock",)
    with pytest.raises(ConfigError, match=r"^config key 'data_dir': tau2 data file .*/mock/"):
        prepare(config)


@pytest.mark.slow  # a full replay of all tasks
def test_replay_reproduces_the_sheet_and_reports_a_planted_mismatch(tmp_path):
    if not DATA.is_dir():
        pytest.skip(f"tau2 data folder {DATA} is absent")
    prefixes = dict(REFERENCE["retail_gold_prefixes"], **{"7": "0000000000"})
    planted = dict(REFERENCE, retail_gold_prefixes=prefixes)
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(planted))
    config = replay_config(DATA)
    config.reference = str(reference)
    job, _ = prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        with pytest.raises(RuntimeError, match="1 mismatches"):
            job.run(config, run_dir)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mismatches"] == ["retail task 7: gold hash 4759f292bd != sheet 0000000000"]
    retail = summary["domains"]["retail"]
    assert retail["initial_hash"] == REFERENCE["retail_initial"]
    assert len(retail["tasks"]) == 114 and all(t["live_match"] for t in retail["tasks"].values())
    assert {k: t["gold_hash"][:10] for k, t in retail["tasks"].items()} == REFERENCE["retail_gold_prefixes"]
    assert all(t["reward"] == 1.0 for t in retail["tasks"].values())
    assert sum(bool(t["not_evaluated"]) for t in retail["tasks"].values()) == 40
    assert len(summary["domains"]["mock"]["tasks"]) == 10
    assert "## MISMATCHES" in (tmp_path / "run" / "summary.md").read_text()
