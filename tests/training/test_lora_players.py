"""A LoRA model as a player of the dialogue loop ("BASE+ADAPTER", e.g. the P4G human proxy as a frozen
simulator): the population stacks its adapter over one unstacked base, a training step runs, and a run
records the adapters it loads."""

import hashlib
import json
import shutil

import jax
import numpy as np
import pytest

from experiments.configs.target_word import get_config
from scope_jax.models import lora
from scope_jax.training import rl_step
from scope_jax.training.config import make_env
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import ADAPTERS, RunDir, RunDirError
from scope_jax.training.setup import build
from scope_jax.training.train import train
from scope_jax.training.state import stack_population


@pytest.fixture(scope="module")
def adapter_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapter")
    graphdef, base, _ = load_model("tiny:1", words=make_env(get_config("frozen").env).vocabulary)
    _, fresh = lora.init(graphdef, base, lora.LoRAConfig(rank=2), seed=0)
    adapter = jax.tree.map(lambda x: 0.1 * np.ones_like(x), fresh.adapter)
    lora.save_adapter(folder, adapter, lora.LoRAConfig(rank=2))
    return folder


def test_a_frozen_lora_simulator_plays_and_the_agent_trains(adapter_folder):
    config = get_config("frozen")
    config.sim.model = f"tiny:1+{adapter_folder}"
    config.rollout.update(groups=2, group_size=2)
    setup = build(config)
    sims = setup.sims.members.params if setup.sims.members is not None else setup.sims.listed[0].params
    assert isinstance(sims, lora.LoRAParams)
    _, metrics, episodes = rl_step.rl_step(setup, setup.state, 0)
    assert len(episodes) == 4 and np.isfinite(metrics["loss"])


def test_a_lora_population_stacks_the_adapters_over_one_base(adapter_folder):
    graphdef, params, _ = load_model(f"tiny:1+{adapter_folder}", words=("a", "b"))
    twin = params._replace(adapter=jax.tree.map(lambda x: 2 * x, params.adapter))
    stacked = stack_population([params, twin])
    assert stacked.base is params.base  # shared, no population axis
    for one, two, both in zip(jax.tree.leaves(params.adapter), jax.tree.leaves(twin.adapter),
                              jax.tree.leaves(stacked.adapter)):
        np.testing.assert_array_equal(both, np.stack([one, two]))
    other = params._replace(base=jax.tree.map(lambda x: x + 1, params.base))
    with pytest.raises(ValueError, match="one base"):
        stack_population([params, other])


def test_a_run_records_the_adapters_it_loads_and_refuses_to_resume_after_one_changed(adapter_folder,
                                                                                    tmp_path):
    folder = tmp_path / "judge"
    shutil.copytree(adapter_folder, folder)
    config = get_config("frozen")
    config.eval.sim_models = (f"tiny:1+{folder}",)
    config.rollout.update(groups=1, group_size=2)
    config.train.update(steps=1, eval_every=0, eval_first=False, checkpoint_every=1)
    (weights,) = folder.glob("*.safetensors")
    with RunDir.create(tmp_path / "run", config) as run_dir:
        train(config, run_dir)
    recorded = json.loads((tmp_path / "run" / ADAPTERS).read_text())
    assert recorded == {f"tiny:1+{folder}": hashlib.sha256(weights.read_bytes()).hexdigest()}
    graphdef, base, _ = load_model("tiny:1", words=make_env(config.env).vocabulary)
    _, other = lora.init(graphdef, base, lora.LoRAConfig(rank=2), seed=1)
    lora.save_adapter(folder, other.adapter, lora.LoRAConfig(rank=2))
    with pytest.raises(RunDirError, match="no longer matches this run"):
        with RunDir.create(tmp_path / "run", config) as run_dir:  # unfinished: it would resume
            train(config, run_dir)
