"""LoRA in the training steps: base + adapter roles in the RL train step and the SFT step as they are, a
population of adapters over one base equal to each member alone, the base frozen (no optimizer state,
bitwise unchanged), and the partition rules stacking adapters but not the shared base."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from scope_jax import sharding
from scope_jax.models import lora
from scope_jax.models.decoder import population_member, population_of_one
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch, TokenBatch
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.sft_step import SFTStepConfig, make_sft_step
from scope_jax.training.train_step import TrainStepConfig, make_train_step

from .conftest import random_role_batch

LORA = lora.LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
ADAMW = OptimizerConfig(name="adamw", learning_rate=1e-2, sim_learning_rate=1e-2)


def lora_models(tiny_models):
    """(plain graphdef, agent params, LoRA graphdef, a population of 2 adapters over one simulator base)."""
    graphdef, agent, sims = tiny_models
    lora_graphdef, first = lora.init(graphdef, sims[0], LORA, seed=1)
    _, second = lora.init(graphdef, sims[0], LORA, seed=2)
    # B is zero at init, which makes A's gradient zero; a nonzero B lets both factors' gradients show.
    nonzero = lambda adapter, seed: jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.key(seed), x.shape), adapter)
    population = lora.LoRAParams(sims[0], joint.stack_population([nonzero(first.adapter, 3),
                                                                  nonzero(second.adapter, 4)]))
    return graphdef, agent, lora_graphdef, population


def rl_step(graphdef, lora_graphdef, agent, sims, sim_batch):
    optimizer = make_optimizer(ADAMW, {"agent": True, "sims": True})
    config = TrainStepConfig(agent=LossConfig(kl_coef=0.1), sims=LossConfig(kl_coef=0.1))
    state = joint.create({"agent": agent, "sims": sims}, optimizer, seed=0, ref_roles=("agent", "sims"))
    batch = Batch(agent=random_role_batch(0, (4,)), sims=sim_batch)
    return jax.jit(make_train_step(graphdef, lora_graphdef, optimizer, config)), state, batch


def test_a_lora_population_in_the_rl_step_equals_each_member_alone(tiny_models):
    graphdef, agent, lora_graphdef, population = lora_models(tiny_models)
    sim_batch = random_role_batch(1, (2, 4))
    step, state, batch = rl_step(graphdef, lora_graphdef, agent, population, sim_batch)
    together, metrics = step(state, batch)
    for p in range(2):
        member = population_of_one(population_member(population, p))
        member_batch = jax.tree.map(lambda x: x[p:p + 1], sim_batch)
        step_alone, state_alone, batch_alone = rl_step(graphdef, lora_graphdef, agent, member, member_batch)
        alone, alone_metrics = step_alone(state_alone, batch_alone)
        for name in ("sims/pg_loss", "sims/kl", "sims/entropy"):
            np.testing.assert_allclose(metrics[name][p], alone_metrics[name][0], rtol=1e-5, atol=1e-7)
        for a, b in zip(jax.tree.leaves(population_member(together.params["sims"].adapter, p)),
                        jax.tree.leaves(alone.params["sims"].adapter)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b)[0], rtol=1e-5, atol=1e-6)
    moved = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(population.adapter), jax.tree.leaves(together.params["sims"].adapter))]
    assert all(moved)


def test_the_base_is_frozen_without_optimizer_state_and_bitwise_unchanged(tiny_models):
    """Two AdamW steps (weight decay on) of an SFT step on a LoRA agent: the adapter moves, the base does
    not move by a bit, and the optimizer holds moments for the adapter only."""
    graphdef, base, _ = tiny_models
    lora_graphdef, params = lora.init(graphdef, base, LORA, seed=0)
    config = OptimizerConfig(name="adamw", learning_rate=1e-2, weight_decay=0.1)
    optimizer = make_optimizer(config, {"agent": True})
    state = joint.create({"agent": params}, optimizer, seed=0)
    adapter_size = sum(x.size for x in jax.tree.leaves(params.adapter))
    assert sum(x.size for x in jax.tree.leaves(state.opt_state)) == 2 * adapter_size + 1  # mu, nu, count
    step = jax.jit(make_sft_step(lora_graphdef, optimizer, SFTStepConfig(role="agent")))
    b = random_role_batch(5, (4,))
    before = jax.tree.map(np.asarray, params)
    for _ in range(2):
        state, metrics = step(state, TokenBatch(b.tokens, b.positions, b.loss_mask))
    assert float(metrics["skipped"]) == 0.0
    for old, new in zip(jax.tree.leaves(before.base), jax.tree.leaves(state.params["agent"].base)):
        assert np.array_equal(old, np.asarray(new)) and old.dtype == new.dtype
    assert all(not np.array_equal(old, np.asarray(new)) for old, new in
               zip(jax.tree.leaves(before.adapter), jax.tree.leaves(state.params["agent"].adapter)))


def test_partition_rules_stack_the_adapters_and_not_the_shared_base(tiny_models):
    graphdef, agent, _, population = lora_models(tiny_models)
    mesh = sharding.make_mesh(fsdp=2, tensor=4)
    specs = sharding.partition_specs({"agent": agent, "sims": population}, joint.joint_rules(), mesh)
    assert specs["sims"].base["layers"]["self_attn"]["q_proj"]["kernel"] == P(None, "fsdp", "tensor")
    assert specs["agent"]["layers"]["self_attn"]["q_proj"]["kernel"] == P(None, "fsdp", "tensor")
    adapter = specs["sims"].adapter["layers"]["self_attn"]["q_proj"]
    assert adapter["lora_a"] == adapter["lora_b"] == P(None, None, None, None)  # [P, layers, ...] replicated
