"""End to end: the theory job through experiments.run, quick config, in a subprocess."""

import json
import pathlib
import subprocess
import sys

import pytest

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
