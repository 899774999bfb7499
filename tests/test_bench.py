"""Benchmark helpers that compute something: the rl_step log-prob recomputation, the decode-step breakdown."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import compiled_ops, op_kind, recompute_logprobs
from experiments.configs.target_word import get_config
from scope_jax import sampling
from scope_jax.models import decoder
from scope_jax.models.tiny import tiny_config
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


def test_the_decode_breakdown_counts_the_decode_loops_output_head_as_the_head():
    """The loop runs the head feature-major (another einsum than the prefill's); a pattern that misses it
    files the head's time under layer matmuls."""
    graphdef, params = decoder.init(tiny_config(64), seed=0)
    args = (graphdef, params, jnp.ones((2, 4), jnp.int32), jnp.full(2, 4, jnp.int32), jax.random.key(0),
            sampling.SamplingConfig(temperature=0.0, max_new_tokens=3))
    ops = compiled_ops(sampling._decode_jit, *args)
    loop_kinds = {op_kind(name, op) for name, op in ops.items() if "/while/body/" in op}
    assert {"output head", "layer matmuls", "attention"} <= loop_kinds, loop_kinds
