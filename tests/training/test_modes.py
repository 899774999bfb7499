"""Every simulator mode is a configuration of the one loop: two training steps each on tiny models."""

import jax
import numpy as np
import pytest

from experiments.run import prepare
from scope_jax.training import loop
from scope_jax.training.run_dir import RunDir

MONITOR_KEYS = ("agent/entropy", "monitor/zero_variance_groups", "monitor/agent_distinct_n",
                "monitor/agent_identical", "monitor/agent_sampled_entropy", "monitor/sim_sampled_entropy",
                "monitor/sim_deviation", "monitor/variance_sim_share", "heldout_reward")


def run_mode(tmp_path, mode: str, **sim):
    config = loop.default_config()
    config.sim.mode = mode
    config.sim.update(sim)
    config.rollout.update(groups=2, group_size=4)
    config.sampling.max_new_tokens = 4
    config.verbalized.max_new_tokens = 16
    config.monitor.update(probe_contexts=2, probe_samples=2, fork_contexts=1, forks=2, branches=2)
    config.train.update(steps=2, eval_every=2, checkpoint_every=2, eval_groups=1)
    config.algo.sim_kl_coef = 0.1
    prepare(config)
    initial = loop.build(config).state
    with RunDir.create(tmp_path / mode, config) as run_dir:
        state, _ = loop.train(config, run_dir)
        records = run_dir.read_metrics()
    return initial, state, records


def changed(before, after) -> list[bool]:
    return [not np.array_equal(np.asarray(b), np.asarray(a))
            for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after))]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["frozen", "verbalized", "rotation"])
def test_frozen_simulators_stay_bit_identical(tmp_path, mode):
    initial, state, records = run_mode(tmp_path, mode)
    assert any(changed(initial.params["agent"], state.params["agent"]))
    if mode != "rotation":  # rotation's simulators live outside the trained state
        assert not any(changed(initial.params["sims"], state.params["sims"]))
    else:
        assert "sims" not in state.params
    assert all(key in records[-1] for key in MONITOR_KEYS), set(MONITOR_KEYS) - set(records[-1])
    if mode == "verbalized":
        # A random tiny model never writes parsable verbalizations: every turn falls back, counted.
        assert records[-1]["verbalized/fallback_rate"] == 1.0
        assert records[-1]["verbalized/turns"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode,sim", [("cotrain", {}), ("population", {"population": 2}), ("selfplay", {})])
def test_trained_simulators_change(tmp_path, mode, sim):
    initial, state, records = run_mode(tmp_path, mode, **sim)
    if mode == "selfplay":
        assert "sims" not in state.params and all(changed(initial.params["agent"], state.params["agent"]))
    else:
        assert all(changed(initial.params["sims"], state.params["sims"]))
    if mode == "population":
        assert {"sims/entropy/0", "sims/entropy/1"} <= set(records[-1])
    assert all(key in records[-1] for key in MONITOR_KEYS), set(MONITOR_KEYS) - set(records[-1])
