"""The CooperBench RL configs pass their checks in every partner mode, and one tiny step runs end to end."""

import numpy as np
import pytest

from experiments.configs import cooperbench, cooperbench_qwen3
from experiments.jobs import cooperbench as job
from experiments.run import prepare
from scope_jax.training.run_dir import RunDir


@pytest.mark.parametrize("mode", cooperbench.MODES)
def test_every_partner_mode_passes_the_check(mode):
    config = cooperbench.get_config(mode)
    assert prepare(config)[0] is job
    assert config.env.mode == ("solo" if mode == "solo" else "coop")
    assert config.sim.mode == ("frozen" if mode == "solo" else mode)


def test_the_context_budget_covers_every_turn():
    config = cooperbench.get_config()
    env = config.env
    per_turn = (config.sampling.max_new_tokens + cooperbench.TEMPLATE_TOKENS
                + (env.max_observation_chars + env.max_message_chars) / cooperbench.CHARS_PER_TOKEN)
    need = cooperbench.PROMPT_TOKENS["coop"] + env.max_turns * per_turn
    assert need <= config.agent.max_context < need + 128 and config.agent.max_context % 128 == 0
    with pytest.raises(ValueError, match="unknown cooperbench mode 'duo'"):
        cooperbench.get_config("duo")


@pytest.mark.parametrize("arg", ["0.6b", "1.7b:cotrain", "4b:population", "/data/Qwen3-0.6B:solo"])
def test_the_qwen3_config_passes_the_check(arg, qwen3_folders):
    config = cooperbench_qwen3.get_config(arg)
    prepare(config)
    assert config.agent.dtype == "bfloat16" and config.agent.remat and config.sim.remat
    rows = config.rollout.groups * config.rollout.group_size
    assert rows == cooperbench_qwen3.ROWS and rows % (config.train.microbatches * 8) == 0


@pytest.mark.slow
def test_one_tiny_step_end_to_end(tmp_path):
    config = cooperbench.get_config()
    config.agent.update(model="tiny:0", max_context=2048, remat=False)
    config.sim.update(model="tiny:1", remat=False)
    config.eval.sim_models = ("tiny:2",)
    config.env.update(max_turns=2, isolation="process")
    config.sampling.max_new_tokens = 8
    config.train.update(steps=1, eval_every=1, checkpoint_every=1, microbatches=1)
    _, checked = prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        job.run(config, run_dir, checked)
    [record] = RunDir(tmp_path / "run").read_metrics()
    assert np.isfinite(record["loss"]) and record["skipped"] == 0.0 and "heldout_reward" in record
    assert record["env/success"] == 0.0 and record["env/steps"] > 0  # random tiny models pass nothing
    assert "monitor/variance_sim_share" in record  # the monitor's forks ran
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "## CooperBench outcomes per step" in summary and "| 0 | 0.00 | 0.00 |" in summary
