"""The tau2 RL configs: every simulator mode passes the run's checks without loading a model (CPU and
Qwen3 configs), the Qwen3 memory table counts what it says, and one tiny training step runs end to end."""

import json

import numpy as np
import pytest

from experiments.configs import p4g_qwen3, tau2, tau2_qwen3
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train import train
from tests.envs.tau2.conftest import DATA

MODES = ("frozen", "verbalized", "cotrain", "population", "rotation", "mixture", "selfplay")


@pytest.fixture(scope="module", autouse=True)
def data():
    if not DATA.is_dir():
        pytest.skip(f"tau2 data folder {DATA} is absent")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_passes_the_checks(mode, qwen3_folders):
    cpu = tau2.get_config(mode)
    prepare(cpu)
    assert cpu.env.tool_format == "text" and cpu.env.agent_prompt == "compact"  # SmolLM2: no tools= support
    big = tau2_qwen3.get_config(f"1.7b:{mode}")
    prepare(big)
    assert big.env.tool_format == "template" and big.env.agent_prompt == "full"
    assert big.agent.model == big.env.judge_model == "/models/Qwen3-1.7B"


def test_bad_env_settings_stop_the_check_in_one_line():
    config = tau2.get_config()
    config.env.agent_prompt = "short"
    with pytest.raises(ConfigError, match="agent_prompt 'short'"):
        prepare(config)


def test_memory_rows_count_the_roles():
    arch = p4g_qwen3.ARCHITECTURES["0.6b"]
    frozen, cotrain = tau2_qwen3.memory_rows(shards=1)[:2]
    # frozen: 1 trained model (params, gradient, 2 moments) + 3 frozen; cotrain: 2 trained + 2 frozen + 1 ref
    assert frozen["state"] * 2**30 == pytest.approx(arch.num_params * 2 * (4 + 3))
    assert cotrain["state"] * 2**30 == pytest.approx(arch.num_params * 2 * (8 + 2 + 1))
    assert frozen["prefill"] * 2**30 == 64 * 16 * 8192**2 * 4  # rows x heads x L^2 float32


@pytest.mark.slow
def test_one_tiny_step_end_to_end(tmp_path):
    """tau2 through the whole loop with tiny random models (their replies are no valid messages, so the
    episodes end as agent errors, reward 0): train step, held-out evaluation, samples."""
    config = tau2.get_config("frozen", model="tiny:0")
    config.env.update(data_dir=str(DATA), max_steps=4, judge_model="")
    config.sim.model, config.eval.sim_models = "tiny:1", ("tiny:2",)
    config.sampling.max_new_tokens = 4
    config.train.update(steps=1, eval_every=1, checkpoint_every=1)
    _, checked = prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        state, metrics = train(config, run_dir, checked)
    assert int(state.step) == 1 and metrics["skipped"] == 0.0 and np.isfinite(metrics["loss"])
    assert "heldout_reward" in metrics and metrics["reward"] == 0.0
    assert sum(v for k, v in metrics.items() if k.startswith("end/")) == pytest.approx(1.0)
    sample = json.loads((tmp_path / "run" / "samples" / "step-0.jsonl").read_text().splitlines()[0])
    assert sample["messages"][0]["role"] == "agent"  # the greeting
