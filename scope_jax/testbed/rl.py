"""The RL run of one arm: every step on device, all steps in one `lax.scan`, all seeds in one `vmap`.

A step: `persona_lm.rollout` plays B = groups x group_size episodes against the arm's simulators
(P members, member p playing a contiguous block of groups), GRPO advantages per group, the agent's
`RoleBatch` (its view, loss on its decisions, the sampler's log-probs) and, when the simulators train,
theirs ([P, M, L]: their view, loss on their replies, adversarial advantages = GRPO of minus the
agent's reward, KL to the reference through `LossConfig.kl_coef`), then the project's one
`make_train_step`. Every `eval_every` steps the agent's (and trained simulators') parameters are
emitted for exact evaluation on the host.

What differs between arms is data, not code: simulator parameters, prompt cards and references, the
`verbalized` flag (a `lax.cond` predicate, not batched over seeds) and the `train_sims` flag. Only the
population size P shapes the compiled program, so arms of one P share it. The train step always
computes both roles' updates; with `train_sims` false the simulators' new parameters are discarded
(the parameters stay bitwise frozen; only their unused optimizer moments move), which costs one
simulator backward pass per step and saves a compilation (tens of seconds on this CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from scope_jax.algorithms import ADVANTAGES, token_mean
from scope_jax.envs import persona_lm as lm
from scope_jax.training.batch import Batch, RoleBatch
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.state import JointState
from scope_jax.training.train_step import TrainStepConfig, make_train_step


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """steps must be a multiple of eval_every; groups a multiple of the arm's members."""

    steps: int = 120
    eval_every: int = 20
    groups: int = 12
    group_size: int = 16
    learning_rate: float = 1e-3
    sim_learning_rate: float = 5e-4
    sim_kl_coef: float = 8.0
    advantage: str = "grpo"

    @property
    def episodes(self) -> int:
        return self.groups * self.group_size


class StepLog(NamedTuple):
    """Per step (leading axes [R, steps] after the run)."""

    reward: jax.Array  # mean training reward
    rewards: jax.Array  # [B] every episode's reward (zero-variance groups are counted on the host)
    agent_entropy: jax.Array  # train step: mean entropy of the agent's act distribution at its decisions
    sampled_deviation: jax.Array  # mean 1 - p_max of the distributions the replies were drawn from
    early_ask: jax.Array  # fraction of episodes that request the donation before it is forced
    vs_malformed: jax.Array  # fraction of verbalization attempts that fell back to direct sampling
    vs_repaired: jax.Array  # fraction of used verbalizations that needed repair
    sim_kl: jax.Array  # trained simulators: mean KL estimate to the reference (0 otherwise)
    skipped: jax.Array  # non-finite step, not applied


class Snapshots(NamedTuple):
    agent: Any  # agent params at the end of each chunk of eval_every steps: [R, E, ...]
    sims: Any  # simulators' params [R, E, P, ...]


def make_runner(agent_graphdef: nnx.GraphDef, sim_graphdef: nnx.GraphDef, config: RLConfig, members: int):
    """run(agent [R], sims [R, P], ref_sims [R, P], cards [P], verbalized [], train_sims [], keys [R])
    -> (final JointState [R], StepLog [R, steps], Snapshots)."""
    if config.groups % members or config.steps % config.eval_every:
        raise ValueError("groups must divide into members and steps into eval_every chunks")
    per_member = config.episodes // members
    optimizer = make_optimizer(
        OptimizerConfig(learning_rate=config.learning_rate, sim_learning_rate=config.sim_learning_rate),
        {"agent": True, "sims": True})
    step_config = TrainStepConfig(agent=LossConfig(allowed_tokens=lm.AGENT_ACTS),
                                  sims=LossConfig(kl_coef=config.sim_kl_coef, allowed_tokens=lm.REPLY_ACTS))
    train_step = make_train_step(agent_graphdef, sim_graphdef, optimizer, step_config)
    advantage = ADVANTAGES[config.advantage]
    group_ids = jnp.arange(config.episodes) // config.group_size

    def one_step(state: JointState, key, cards, verbalized, train_sims):
        d = lm.rollout(agent_graphdef, state.params["agent"], sim_graphdef, state.params["sims"], cards,
                       verbalized, key, members, per_member)
        adv = advantage(d.rewards, group_ids, config.groups)
        agent = RoleBatch(d.tokens, lm.positions_like(d.tokens), d.agent_mask, d.agent_logprobs, adv)
        sim_adv = advantage(-d.rewards, group_ids, config.groups).reshape(members, per_member)
        sims = RoleBatch(d.sim_tokens, lm.positions_like(d.sim_tokens), d.sim_mask, d.sim_logprobs, sim_adv)
        frozen = state.params["sims"]
        state, metrics = train_step(state, Batch(agent=agent, sims=sims))
        kept = jax.tree.map(lambda new, old: jnp.where(train_sims, new, old), state.params["sims"], frozen)
        state = state.replace(params={**state.params, "sims": kept})
        tried = d.replied & verbalized
        log = StepLog(
            reward=d.rewards.mean(), rewards=d.rewards, agent_entropy=metrics["agent/entropy"],
            sampled_deviation=token_mean(1.0 - d.sim_pmax, d.replied),
            early_ask=jnp.mean(d.tokens[:, -1] != lm.ASK_TOKEN),
            vs_malformed=token_mean(d.malformed, tried),
            vs_repaired=token_mean(d.repaired, d.verbalized),
            sim_kl=jnp.where(train_sims, jnp.mean(metrics["sims/kl"]), 0.0),
            skipped=metrics["skipped"])
        return state, log

    def run_seed(agent, sims, ref_sims, cards, verbalized, train_sims, key):
        params = {"agent": agent, "sims": sims}
        state = JointState(params=params, ref_params={"sims": ref_sims},
                           opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32),
                           rng=jax.random.key_data(key))

        def chunk(state, chunk_index):
            def body(state, i):
                step_key = jax.random.fold_in(key, chunk_index * config.eval_every + i)
                return one_step(state, step_key, cards, verbalized, train_sims)

            state, logs = jax.lax.scan(body, state, jnp.arange(config.eval_every))
            snapshot = Snapshots(state.params["agent"], state.params["sims"])
            return state, (logs, snapshot)

        state, (logs, snapshots) = jax.lax.scan(chunk, state, jnp.arange(config.steps // config.eval_every))
        logs = jax.tree.map(lambda x: x.reshape(config.steps, *x.shape[2:]), logs)
        return state, logs, snapshots

    return jax.jit(jax.vmap(run_seed, in_axes=(0, 0, 0, None, None, None, 0)))
