import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch
from scope_jax.algorithms import AGGREGATIONS
from scope_jax.training.loss import LossConfig, aggregation_weights
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.train_step import TrainStepConfig, compile_train_step, make_train_step

from .conftest import random_role_batch

# SGD: the update is linear in the gradient, so comparing updated params compares gradients. (Adam's
# first step is ~lr * sign(g) and would amplify float noise in near-zero gradients to lr.)
OPT = OptimizerConfig(name="sgd", learning_rate=1e-1, sim_learning_rate=1e-1)


def build(tiny_models, *, train_sims: bool, population: int = 2, microbatches: int = 1,
          kl: float = 0.0, aggregation: str = "token_mean"):
    graphdef, agent, sims = tiny_models
    params = {"agent": agent, "sims": joint.stack_population(sims[:population])}
    optimizer = make_optimizer(OPT, {"agent": True, "sims": train_sims})
    loss = LossConfig(kl_coef=kl, aggregation=aggregation)
    config = TrainStepConfig(agent=loss, sims=loss if train_sims else None, microbatches=microbatches)
    refs = ("agent", "sims") if kl else ()
    state = joint.create(params, optimizer, seed=0, ref_roles=refs)
    batch = Batch(agent=random_role_batch(0, (8,)),
                  sims=random_role_batch(1, (population, 4)) if train_sims else None)
    return make_train_step(graphdef, graphdef, optimizer, config), state, batch


def assert_trees_close(a, b, atol):
    diffs = jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b))
    assert max(diffs) <= atol, max(diffs)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregation_weights_reproduce_the_aggregation(aggregation):
    batch = random_role_batch(3, (6,))
    values = jax.random.normal(jax.random.key(0), batch.loss_mask.shape)
    weights = aggregation_weights(batch.loss_mask, aggregation)
    np.testing.assert_allclose(jnp.sum(values * weights), AGGREGATIONS[aggregation](values, batch.loss_mask),
                               rtol=1e-6)
    # Summing over row blocks (micro-batches) gives the full-batch value, unlike averaging block aggregates.
    halves = [jnp.sum(values[i:i + 3] * weights[i:i + 3]) for i in (0, 3)]
    np.testing.assert_allclose(sum(halves), AGGREGATIONS[aggregation](values, batch.loss_mask), rtol=1e-6)


def test_microbatched_step_equals_full_batch(tiny_models):
    aggregation = "seq_mean_token_mean"
    step, state, batch = build(tiny_models, train_sims=True, aggregation=aggregation)
    full_state, full_metrics = jax.jit(step)(state, batch)
    step4, _, _ = build(tiny_models, train_sims=True, microbatches=4, aggregation=aggregation)
    micro_state, micro_metrics = jax.jit(step4)(state, batch)
    np.testing.assert_allclose(micro_metrics["loss"], full_metrics["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(micro_metrics["agent/entropy"], full_metrics["agent/entropy"], rtol=1e-5)
    assert_trees_close(micro_state.params, full_state.params, atol=1e-6)


def test_frozen_simulator_is_bit_identical_and_agent_moves(tiny_models):
    step, state, batch = build(tiny_models, train_sims=False)
    sims_before = jax.tree.map(np.asarray, state.params["sims"])
    agent_before = jax.tree.map(np.asarray, state.params["agent"])
    run = jax.jit(step)
    for _ in range(2):
        state, _ = run(state, batch)
    for before, after in zip(jax.tree.leaves(sims_before), jax.tree.leaves(state.params["sims"])):
        assert np.array_equal(before, np.asarray(after)) and before.dtype == after.dtype
    moved = [not np.array_equal(b, np.asarray(a))
             for b, a in zip(jax.tree.leaves(agent_before), jax.tree.leaves(state.params["agent"]))]
    assert all(moved)


def test_cotrained_simulators_move(tiny_models):
    step, state, batch = build(tiny_models, train_sims=True, kl=0.1)
    sims_before = jax.tree.map(np.asarray, state.params["sims"])
    new_state, metrics = jax.jit(step)(state, batch)
    for p in range(2):
        changed = [not np.array_equal(b[p], np.asarray(a[p])) for b, a in
                   zip(jax.tree.leaves(sims_before), jax.tree.leaves(new_state.params["sims"]))]
        assert all(changed)
    assert metrics["sims/kl"].shape == (2,)
    # First step: params equal their reference, so every KL estimate is exactly zero.
    np.testing.assert_allclose(metrics["sims/kl"], 0.0, atol=1e-6)


def test_non_finite_step_is_skipped(tiny_models):
    step, state, batch = build(tiny_models, train_sims=True)
    bad = batch.replace(agent=batch.agent.replace(advantages=batch.agent.advantages.at[0].set(jnp.nan)))
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    new_state, metrics = jax.jit(step)(state, bad)
    assert float(metrics["skipped"]) == 1.0
    assert int(new_state.step) == 1
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves((new_state.params, new_state.opt_state))):
        assert np.array_equal(b, np.asarray(a))


def test_sharded_step_on_8_devices_equals_one_device(tiny_models):
    assert jax.device_count() == 8
    step, state, batch = build(tiny_models, train_sims=True, kl=0.1)
    one_state, one_metrics = jax.jit(step)(state, batch)

    _, state, batch = build(tiny_models, train_sims=True, kl=0.1)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sharded = compile_train_step(step, state, batch, mesh)
    # The step donates its state: copies, so the session's tiny models are not deleted with it (device_put
    # may reuse a buffer that already lies on a target device).
    state = jax.device_put(jax.tree.map(jnp.copy, state), joint.state_shardings(state, mesh))
    eight_state, eight_metrics = sharded(state, batch)
    q_kernel = eight_state.params["agent"]["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q_kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    np.testing.assert_allclose(eight_metrics["loss"], one_metrics["loss"], rtol=1e-5, atol=1e-6)
    assert_trees_close(eight_state.params, one_state.params, atol=1e-5)
