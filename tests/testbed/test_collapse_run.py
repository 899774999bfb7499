"""End to end: the collapse job's quick config through experiments.run, in a subprocess; and what its check
refuses before any work."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from experiments.configs.collapse import get_config
from experiments.run import prepare
from scope_jax.config import ConfigError

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


def test_the_quick_config_passes_its_check():
    prepare(get_config("quick"))


@pytest.mark.parametrize("key, value, rule", [
    ("rl.eval_every", 0, "at least 1"),  # was a ZeroDivisionError in the check
    ("rl.steps", 0, "at least 1"),  # was an IndexError after pretraining
    ("rl.groups", 0, "at least 1"),
    ("rl.group_size", 1, "at least 2"),  # every advantage 0: the RL would learn nothing
    ("pretrain.agent_steps", 0, "at least 1"),
    ("pretrain.batch", 0, "at least 1"),
    ("data.check_every", 0, "at least 1"),
    ("rl.learning_rate", float("nan"), "finite and at least 0"),
    ("rl.advantage", "ppo", "one of "),
    ("workers", 0, "at least 1"),
])
def test_a_count_of_zero_or_a_bad_setting_is_one_line_before_any_work(key, value, rule):
    config = get_config("quick")
    config.update_from_flattened_dict({key: value})
    with pytest.raises(ConfigError, match=rf"^config key '{re.escape(key)}' is .*; it must be {rule}"):
        prepare(config)
