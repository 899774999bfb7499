"""The rl_step benchmark's log-prob recomputation, on a real rollout of the target-word example config."""

import functools

import jax
import numpy as np

from experiments.bench import recompute_logprobs
from experiments.configs.target_word import get_config
from scope_jax.training import rl_step
from scope_jax.training.setup import build


def test_recomputed_logprobs_match_the_samplers_on_every_trained_token():
    config = get_config("selfplay")  # one model plays and trains both roles: both batches are recomputed
    setup = build(config)
    episodes = rl_step.play_episodes(setup, setup.state, 0)
    batch = rl_step.make_batch(setup, episodes, rl_step.role_advantages(setup, episodes))
    recomputed = jax.jit(functools.partial(recompute_logprobs, setup))(setup.state.params, batch)
    assert set(recomputed) == {"agent", "sims"}
    for role, role_batch in (("agent", batch.agent), ("sims", batch.sims)):
        mask = np.asarray(role_batch.loss_mask) > 0
        assert mask.sum() > 0
        old = np.asarray(role_batch.old_logprobs)[mask]
        np.testing.assert_allclose(np.asarray(recomputed[role])[mask], old, atol=1e-4, err_msg=role)
