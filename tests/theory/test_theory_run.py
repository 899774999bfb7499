"""End to end: the theory job through experiments.run, quick config, in a subprocess; and what its check
refuses before any work."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from experiments.configs.theory import get_config
from experiments.run import prepare
from scope_jax.config import ConfigError

STATEMENTS = ("theorem_3_2", "lemma_3_3", "proposition_3_4", "corollary_3_5", "proposition_3_6")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_writes_checks_and_figures(tmp_path):
    workdir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "experiments.run", "--config=experiments/configs/theory.py:quick",
                    f"--workdir={workdir}"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    results = json.loads((workdir / "checks.json").read_text())
    assert sorted(results) == sorted(STATEMENTS)
    for name, entry in results.items():
        assert entry["holds"] and entry["max_ratio"] <= 1.0 + 1e-9, (name, entry)
        assert all(entry["claims"].values()), (name, entry["claims"])
        assert (workdir / "figures" / f"{name}.png").stat().st_size > 10_000
    assert (workdir / "summary.md").exists()


def test_the_quick_config_passes_its_check():
    prepare(get_config("quick"))


@pytest.mark.parametrize("key", ["instances", "sweep_points", "group_size", "dialogue.actions",
                                 "bandit.replies", "md.steps", "pg.steps", "toy.grid"])
def test_a_count_of_zero_is_one_line_before_any_work(key):
    config = get_config("quick")
    config.update_from_flattened_dict({key: 0})
    with pytest.raises(ConfigError, match=rf"^config key '{re.escape(key)}' is 0; it must be at least 1$"):
        prepare(config)
