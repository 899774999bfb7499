"""The SFT loss and step, and the simulators' data anchor in the RL train step, against a reference NLL
computed from the model's full logits (no chunked head, no aggregation weights)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import forward
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch, TokenBatch
from scope_jax.training.loss import LossConfig, aggregation_weights, nll_loss
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.sft_step import SFTStepConfig, make_sft_step
from scope_jax.training.train_step import TrainStepConfig, make_train_step

from .conftest import random_role_batch

# SGD without clipping: the update is -lr x the gradient, so updates compare gradients.
SGD = OptimizerConfig(name="sgd", learning_rate=0.5, sim_learning_rate=0.5, max_grad_norm=0.0)


def token_batch(seed: int, lead: tuple[int, ...]) -> TokenBatch:
    b = random_role_batch(seed, lead)
    return TokenBatch(b.tokens, b.positions, b.loss_mask)


def reference_nll(graphdef, params, batch: TokenBatch) -> jax.Array:
    """Mean over masked tokens of -log softmax(logits[t - 1])[token t], from the full logits."""
    logits, _ = forward(graphdef, params, batch.tokens, batch.positions)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, batch.tokens[:, 1:, None], axis=-1)[..., 0]
    mask = batch.loss_mask[:, 1:]
    return -jnp.sum(picked * mask) / jnp.sum(mask)


def test_nll_loss_equals_the_full_logit_reference(tiny_models):
    graphdef, agent, _ = tiny_models
    batch = token_batch(0, (6,))
    weights = aggregation_weights(batch.loss_mask, "token_mean")
    loss, metrics = nll_loss(graphdef, agent, batch, weights, LossConfig(chunk_size=5))
    np.testing.assert_allclose(loss, reference_nll(graphdef, agent, batch), rtol=1e-5)
    np.testing.assert_allclose(metrics["nll"], loss)


@pytest.mark.parametrize("role", ["agent", "sims"])
def test_sft_step_is_a_gradient_step_on_the_nll_and_microbatches_are_exact(tiny_models, role):
    graphdef, agent, sims = tiny_models
    params = {"agent": agent} if role == "agent" else {"sims": joint.stack_population(sims[:2])}
    optimizer = make_optimizer(SGD, {role: True})
    batch = token_batch(1, (8,) if role == "agent" else (2, 4))
    state = joint.create(params, optimizer, seed=0)
    full, metrics = jax.jit(make_sft_step(graphdef, optimizer, SFTStepConfig(role=role)))(state, batch)
    micro_step = make_sft_step(graphdef, optimizer, SFTStepConfig(role=role, microbatches=2))
    micro, micro_metrics = jax.jit(micro_step)(state, batch)

    if role == "agent":
        grad = jax.grad(reference_nll, argnums=1)(graphdef, agent, batch)
        expected_loss = reference_nll(graphdef, agent, batch)
    else:
        member = lambda p, b: reference_nll(graphdef, p, b)
        grad = jax.vmap(jax.grad(member))(params["sims"], batch)
        expected_loss = jnp.sum(jax.vmap(member)(params["sims"], batch))
    np.testing.assert_allclose(metrics["loss"], expected_loss, rtol=1e-5)
    np.testing.assert_allclose(micro_metrics["loss"], expected_loss, rtol=1e-5)
    for new, old, g in zip(jax.tree.leaves(full.params[role]), jax.tree.leaves(params[role]),
                           jax.tree.leaves(grad)):
        np.testing.assert_allclose(new, old - SGD.learning_rate * g, atol=2e-6)
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_sft_steps_lower_the_nll_of_their_data(tiny_models):
    graphdef, agent, _ = tiny_models
    optimizer = make_optimizer(OptimizerConfig(learning_rate=1e-2), {"agent": True})
    batch = token_batch(2, (8,))
    state = joint.create({"agent": agent}, optimizer, seed=0)
    step = jax.jit(make_sft_step(graphdef, optimizer, SFTStepConfig(role="agent")))
    losses = []
    for _ in range(20):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses


def test_data_anchor_adds_data_coef_times_the_nll_gradient_to_each_simulator(tiny_models):
    graphdef, agent, sims = tiny_models
    params = {"agent": agent, "sims": joint.stack_population(sims[:2])}
    optimizer = make_optimizer(SGD, {"agent": True, "sims": True})
    state = joint.create(params, optimizer, seed=0)
    data = token_batch(3, (2, 4))
    batch = Batch(agent=random_role_batch(0, (8,)), sims=random_role_batch(1, (2, 4)), sim_data=data)
    coef = 0.7

    def run(data_coef):
        config = TrainStepConfig(agent=LossConfig(), sims=LossConfig(data_coef=data_coef))
        return jax.jit(make_train_step(graphdef, graphdef, optimizer, config))(state, batch)

    anchored, metrics = run(coef)
    plain, _ = run(0.0)
    grad = jax.vmap(jax.grad(lambda p, b: reference_nll(graphdef, p, b)))(params["sims"], data)
    for a, p, g in zip(jax.tree.leaves(anchored.params["sims"]), jax.tree.leaves(plain.params["sims"]),
                       jax.tree.leaves(grad)):
        np.testing.assert_allclose(a - p, -SGD.sim_learning_rate * coef * g, atol=2e-6)
    np.testing.assert_allclose(metrics["sims/nll"], jax.vmap(lambda p, b: reference_nll(graphdef, p, b))(
        params["sims"], data), rtol=1e-5)
    for a, p in zip(jax.tree.leaves(anchored.params["agent"]), jax.tree.leaves(plain.params["agent"])):
        np.testing.assert_array_equal(a, p)  # the anchor is the simulators' alone


def test_data_anchor_without_data_is_refused(tiny_models):
    graphdef, agent, sims = tiny_models
    params = {"agent": agent, "sims": joint.stack_population(sims[:2])}
    optimizer = make_optimizer(SGD, {"agent": True, "sims": True})
    config = TrainStepConfig(agent=LossConfig(), sims=LossConfig(data_coef=1.0))
    step = make_train_step(graphdef, graphdef, optimizer, config)
    batch = Batch(agent=random_role_batch(0, (8,)), sims=random_role_batch(1, (2, 4)))
    with pytest.raises(ValueError, match="no sim_data"):
        step(joint.create(params, optimizer, seed=0), batch)
