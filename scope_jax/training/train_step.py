"""The train step: one pure function (JointState, Batch) -> (JointState, metrics) for both roles.

One `jax.value_and_grad` over the joint params gives the agent's gradient and, when the simulators train
(co-training, population, self-play), theirs. The population's loss is `vmap`-ed over its leading axis
P; with `LossConfig.data_coef` each simulator's loss also has the NLL of its `Batch.sim_data` (the data
anchor). Micro-batches are accumulated with `lax.scan` and reproduce the full-batch gradient exactly (see
`loss.aggregation_weights`). A step whose loss or gradient is not finite changes no parameter and no
optimizer moment; its metric `skipped` is 1 so the host loop can count and stop.

`compile_train_step` jits the step with the shardings of the state and batch and donates the state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from scope_jax import sharding
from scope_jax.models.decoder import population_axes, population_of_one
from scope_jax.training.batch import Batch, RoleBatch
from scope_jax.training.loss import LossConfig, aggregation_weights, nll_loss, role_loss
from scope_jax.training.state import JointState, state_shardings

Metrics = dict[str, jax.Array]
TrainStep = Callable[[JointState, Batch], tuple[JointState, Metrics]]


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
    """agent / sims: loss settings per role (sims None: the simulators do not train this step).
    self_play: the simulator role is played by params["agent"] (no "sims" params exist).
    microbatches: gradient-accumulation steps; N (and M per simulator) must divide by it."""

    agent: LossConfig = LossConfig()
    sims: LossConfig | None = None
    self_play: bool = False
    microbatches: int = 1


def split_rows(tree: Any, parts: int, axis: int) -> Any:
    """[..., R, ...] (rows on `axis`) -> [parts, ..., R / parts, ...]."""

    def split(x):
        rows = x.shape[axis]
        if rows % parts:
            raise ValueError(f"{rows} rows do not split into {parts} micro-batches")
        x = x.reshape(x.shape[:axis] + (parts, rows // parts) + x.shape[axis + 1:])
        return jnp.moveaxis(x, axis, 0)

    return jax.tree.map(split, tree)


LossFn = Callable[[Any, Any, Any], tuple[jax.Array, Metrics]]  # (params, ref_params, micro) -> loss


def gradient_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, state: JointState,
                  micro: Any) -> tuple[JointState, Metrics]:
    """One optimizer step on the gradient of `loss_fn` summed over the micro-batches (leading axis of
    every leaf of `micro`), skipped when the loss or the gradient is not finite."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulate(carry, mb):
        (loss, metrics), grads = grad_fn(state.params, state.ref_params, mb)
        return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(grad_fn, state.params, state.ref_params,
                                        jax.tree.map(lambda x: x[0], micro)))
    (loss, metrics), grads = zeros
    (loss, metrics, grads), _ = jax.lax.scan(accumulate, (loss, metrics, grads), micro)

    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep_if_finite = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = state.replace(params=keep_if_finite(params, state.params),
                              opt_state=keep_if_finite(opt_state, state.opt_state), step=state.step + 1)
    metrics.update({"loss": loss, "grad_norm": grad_norm, "skipped": 1.0 - finite.astype(jnp.float32)})
    metrics.update({f"{role}/grad_norm": optax.tree.norm(g) for role, g in grads.items()})
    return new_state, metrics


def make_train_step(agent_graphdef: nnx.GraphDef, sim_graphdef: nnx.GraphDef | None,
                    optimizer: optax.GradientTransformation, config: TrainStepConfig) -> TrainStep:
    """Build the pure train step for one model pair (graphdefs and settings are static)."""
    train_sims = config.sims is not None
    data_anchor = train_sims and bool(config.sims.data_coef)

    def role_weights(mask: jax.Array, aggregation: str, population: bool):
        weigh = lambda m: (aggregation_weights(m, aggregation), aggregation_weights(m, "token_mean"))
        return jax.vmap(weigh)(mask) if population else weigh(mask)

    def loss_fn(params, ref_params, micro) -> tuple[jax.Array, Metrics]:
        agent_batch, agent_w, sim_batch, sim_w, data_batch, data_w = micro
        total, agent_metrics = role_loss(agent_graphdef, params["agent"], ref_params.get("agent"),
                                         agent_batch, *agent_w, config.agent)
        metrics = {f"agent/{k}": v for k, v in agent_metrics.items()}
        if train_sims:
            if config.self_play:
                sim_params = population_of_one(params["agent"])
                sim_ref = population_of_one(ref_params["agent"]) if "agent" in ref_params else None
                graphdef = agent_graphdef
            else:
                sim_params, sim_ref, graphdef = params["sims"], ref_params.get("sims"), sim_graphdef

            def member_loss(p, r, b, w, data, data_weights):
                loss, member_metrics = role_loss(graphdef, p, r, b, *w, config.sims)
                if data_anchor:
                    nll, nll_metrics = nll_loss(graphdef, p, data, data_weights, config.sims)
                    loss = loss + config.sims.data_coef * nll
                    member_metrics = {**member_metrics, **nll_metrics}
                return loss, member_metrics

            ref_axes = None if sim_ref is None else population_axes(sim_ref)
            in_axes = (population_axes(sim_params), ref_axes, 0, 0, 0, 0)
            losses, sim_metrics = jax.vmap(member_loss, in_axes=in_axes)(sim_params, sim_ref, sim_batch, sim_w,
                                                                         data_batch, data_w)
            total = total + jnp.sum(losses)
            metrics.update({f"sims/{k}": v for k, v in sim_metrics.items()})  # per member: [P]
        return total, metrics

    def step(state: JointState, batch: Batch) -> tuple[JointState, Metrics]:
        batch.agent.check()
        agent_w = role_weights(batch.agent.loss_mask, config.agent.aggregation, population=False)
        sim_batch = sim_w = data_batch = data_w = None
        if train_sims:
            batch.sims.check()
            sim_batch = batch.sims
            sim_w = role_weights(batch.sims.loss_mask, config.sims.aggregation, population=True)
        if data_anchor:
            if batch.sim_data is None:
                raise ValueError("sims.data_coef is set but the batch has no sim_data")
            batch.sim_data.check()
            chex.assert_equal_shape_prefix([batch.sim_data.tokens, batch.sims.tokens], 1)
            data_batch = batch.sim_data
            data_w = jax.vmap(lambda m: aggregation_weights(m, "token_mean"))(batch.sim_data.loss_mask)
        k = config.microbatches
        micro = (split_rows(batch.agent, k, 0), split_rows(agent_w, k, 0), split_rows(sim_batch, k, 1),
                 split_rows(sim_w, k, 1), split_rows(data_batch, k, 1), split_rows(data_w, k, 1))
        return gradient_step(loss_fn, optimizer, state, micro)

    return step


def batch_shardings(batch: Batch, mesh: Mesh) -> Batch:
    """Agent rows over (data, fsdp); simulator rows likewise, with the population axis replicated."""
    agent = jax.tree.map(lambda x: sharding.batch_sharding(mesh, x.ndim), batch.agent)
    members = lambda role: (None if role is None else
                            jax.tree.map(lambda x: sharding.batch_sharding(mesh, x.ndim, axis=1), role))
    return Batch(agent=agent, sims=members(batch.sims), sim_data=members(batch.sim_data))


def compile_step(step: Callable, state: JointState, batch_sh: Any, mesh: Mesh):
    """jit a (JointState, batch) step with the state's shardings and `batch_sh`, metrics replicated, the
    state donated. `state` may be abstract (jax.ShapeDtypeStruct); only shapes are read."""
    state_sh = state_shardings(state, mesh)
    return jax.jit(step, in_shardings=(state_sh, batch_sh),
                   out_shardings=(state_sh, sharding.replicated(mesh)), donate_argnums=0)


def compile_train_step(step: TrainStep, state: JointState, batch: Batch, mesh: Mesh):
    """`compile_step` with `batch_shardings`; `batch` may be abstract."""
    return compile_step(step, state, batch_shardings(batch, mesh), mesh)
