"""Job `cooperbench`: dialogue RL on CooperBench (the `dialogue_rl` job), with the CooperBench outcomes of
every step as a table in summary.md: success, each feature's pass, the merges' conflicts, messages sent,
tool errors and how the episodes ended (the step's episodes' means of the environment's outcomes).

Its settings are dialogue_rl's, with the `env` group holding every setting of CooperBenchEnv
(`training.config.env_settings`)."""

from __future__ import annotations

import math

import ml_collections

from experiments.jobs import dialogue_rl
from experiments.jobs.cooperbench_gold import markdown_table
from scope_jax.training.config import Checked, env_settings
from scope_jax.training.run_dir import RunDir

check, schema = dialogue_rl.check, dialogue_rl.schema


def default_config() -> ml_collections.ConfigDict:
    config = dialogue_rl.default_config()
    config.experiment = "cooperbench"
    config.env = env_settings("cooperbench")
    return config


_share = lambda value: "-" if value is None or math.isnan(value) else f"{value:.2f}"
STEP_COLUMNS = (  # (header, metric key, formatter)
    ("step", "step", str), ("reward", "reward", _share), ("success", "env/success", _share),
    ("feature a pass", "env/feature_a_pass", _share), ("feature b pass", "env/feature_b_pass", _share),
    ("naive conflict", "env/naive_conflict", _share), ("unresolved merge", "env/merge_failed", _share),
    ("messages sent", "env/messages_sent", _share), ("tool errors", "env/tool_errors", _share),
    ("tool calls", "env/steps", _share), ("finished seats", "env/finished", _share),
    ("held-out reward", "heldout_reward", _share))


def run(config, run_dir: RunDir, checked: Checked | None = None) -> None:
    dialogue_rl.run(config, run_dir, checked)
    records = run_dir.read_metrics()
    endings = sorted({key for record in records for key in record if key.startswith("end/")})
    columns = STEP_COLUMNS + tuple((f"ended {key[4:]}", key, _share) for key in endings)
    rows = [{key: record.get(key) for _, key, _ in columns} for record in records]
    summary = (run_dir.path / "summary.md").read_text()
    run_dir.write_summary(f"{summary}\n## CooperBench outcomes per step (means over the step's episodes)\n\n"
                          f"{markdown_table(columns, rows)}\n")
