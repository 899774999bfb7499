"""The supervised fine-tuning step: one pure function (JointState, TokenBatch) -> (JointState, metrics).

The loss is `loss.nll_loss`, the masked next-token NLL of one role's tokens, on the same `JointState`,
optimizer, micro-batch accumulation, non-finite guard, shardings and donation as the RL train step
(`train_step.gradient_step`). The trained role is `params[config.role]`: "agent" takes a batch [N, L];
"sims" (a population, leading axis P) takes [P, N, L], each member its own rows, the loss vmapped over P.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from scope_jax import sharding
from scope_jax.models.decoder import population_axes
from scope_jax.training.batch import TokenBatch
from scope_jax.training.loss import LossConfig, aggregation_weights, nll_loss
from scope_jax.training.state import JointState
from scope_jax.training.train_step import Metrics, compile_step, gradient_step, split_rows

SFTStep = Callable[[JointState, TokenBatch], tuple[JointState, Metrics]]


@dataclasses.dataclass(frozen=True)
class SFTStepConfig:
    """role: "agent" or "sims" (the key of the trained params); loss: chunk size, temperature and
    allowed tokens of the log-probs (its RL fields are unused); microbatches must divide the rows."""

    role: str = "sims"
    loss: LossConfig = LossConfig()
    microbatches: int = 1

    def __post_init__(self):
        if self.role not in ("agent", "sims"):
            raise ValueError(f"SFT role {self.role!r} is not one of 'agent', 'sims'")


def make_sft_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                  config: SFTStepConfig) -> SFTStep:
    population = config.role == "sims"
    member_nll = lambda params, batch, weights: nll_loss(graphdef, params, batch, weights, config.loss)

    def loss_fn(params, ref_params, micro):
        batch, weights = micro
        if population:
            in_axes = (population_axes(params["sims"]), 0, 0)
            losses, metrics = jax.vmap(member_nll, in_axes=in_axes)(params["sims"], batch, weights)
            return jnp.sum(losses), {"nll": metrics["nll"]}  # per member: [P]
        return member_nll(params["agent"], batch, weights)

    def step(state: JointState, batch: TokenBatch) -> tuple[JointState, Metrics]:
        batch.check()
        weigh = lambda mask: aggregation_weights(mask, "token_mean")
        weights = jax.vmap(weigh)(batch.loss_mask) if population else weigh(batch.loss_mask)
        axis = 1 if population else 0
        micro = (split_rows(batch, config.microbatches, axis), split_rows(weights, config.microbatches, axis))
        return gradient_step(loss_fn, optimizer, state, micro)

    return step


def compile_sft_step(step: SFTStep, state: JointState, batch: TokenBatch, mesh: Mesh, role: str):
    """jit `step` with the state's shardings, rows over (data, fsdp), metrics replicated, state donated."""
    axis = 1 if role == "sims" else 0
    return compile_step(step, state, jax.tree.map(lambda x: sharding.batch_sharding(mesh, x.ndim, axis=axis),
                                                  batch), mesh)
