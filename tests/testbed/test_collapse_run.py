"""End to end: the collapse job's quick config through experiments.run, in a subprocess."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARMS = ("untrained", "frozen", "frozen_base", "verbalized", "cotrain")


@pytest.mark.slow
def test_quick_run_writes_every_output(tmp_path):
    workdir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "experiments.run", "--config=experiments/configs/collapse.py:quick",
                    f"--workdir={workdir}"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    for name in ("config.json", "metrics.jsonl", "summary.md", "summary.json", "pretrained.msgpack"):
        assert (workdir / name).stat().st_size > 0, name
    assert any((workdir / "tensorboard").iterdir())
    for figure in ("main", "gradient_panel", "metric_heldout_value", "metric_sim_deviation",
                   "metric_sim_variance_share", "metric_zero_variance_groups", "metric_agent_entropy",
                   "metric_grad_cos_mode"):
        assert (workdir / "figures" / f"{figure}.png").stat().st_size > 10_000, figure
    summary = json.loads((workdir / "summary.json").read_text())
    assert sorted(summary["arms"]) == sorted(ARMS)
    for arm in ARMS:
        for key in ("heldout_value", "heldout_success", "heldout_donation", "sim_deviation",
                    "sim_variance_share", "sim_kl_to_start", "grad_cos_mode", "grad_cos_population"):
            assert len(summary["arms"][arm][key]["seeds"]) == 2, (arm, key)
    assert sorted(summary["deltas"]["frozen"]) == ["cotrain", "frozen_base", "verbalized"]
    assert sorted(summary["deltas"]["frozen_base"]) == ["cotrain", "frozen", "verbalized"]
    assert abs(summary["references"]["best adaptive"]["value"] - 0.6503) < 1e-4
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*records)
    for arm in ARMS[1:]:
        for key in ("reward", "agent_entropy", "zero_variance_groups", "heldout_success", "sim_deviation",
                    "grad_cos_mode"):
            assert f"{arm}/{key}/seed0" in keys, (arm, key)
    text = (workdir / "summary.md").read_text()
    assert "What appeared" in text and "Against the frozen base simulator" in text
    assert "What holds by construction" in text
