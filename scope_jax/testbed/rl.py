"""The RL run of one arm: every step on device, all steps in one `lax.scan`, all seeds in one `vmap`.

A step: the members that answer this step are looked up (`ArmInputs.voices`), `persona_lm.rollout`
plays B = groups x group_size episodes against them (block p of the episodes answered by slot p),
GRPO advantages per group, the agent's `RoleBatch` (its view, loss on its decisions, the sampler's
log-probs) and the simulators' ([P, M, L]: their view, loss on their replies, advantages = GRPO of
`sim_sign` x the agent's reward, -1 for the adversarial objective, KL to the reference through
`LossConfig.kl_coef`), then the project's one `make_train_step`. With the regret objective
(`best_response`: regret = V(best response to q, q) - V(agent, q), PAIRED's oracle form) the simulators'
batch is [P, 2M, L]: the agent's episodes with advantages of sim_sign x R, then M episodes per member
played by the exact best response to its current reply table (`persona_lm.sim_reply_table`, solved by
`persona_lm.best_response`) against it, with advantages of +R (GRPO within their own groups), drawn
from a stream of the step's key that the agent's rollout does not use (`persona_lm.play` with a table
agent). The best response is solved every `RLConfig.best_response_every` steps and held fixed in
between (its episodes are played against the current simulators every step). With a data anchor
(`data_coef` > 0) the simulators' loss also has `data_coef` x the NLL of their replies in user
dialogues (`Batch.sim_data`): each step draws M rows of member p's dialogues (`ArmInputs.data`, its
own, e.g. a bootstrap resample), with replacement, from a stream of the step's key that the rollout
does not use.
Every `eval_every` steps the agent's and the simulators' parameters are emitted for exact evaluation on
the host.

What differs between arms is data (`ArmInputs`), not code. Only the population size P, the simulators'
KL and data weights (terms of the compiled loss, absent at 0), self-play and the best-response episodes
(a batch shape; with the best response's refresh period) shape the compiled program, so the arms of
one (P, KL, data weight, objective kind) share it. The simulators' optimizer runs at unit rate and the
step moves them by `sim_learning_rate` times its update, exact for Adam without weight decay (its
moments do not depend on the rate). At rate 0 (frozen arms) the parameters stay bitwise fixed; the train step still computes
their update, which costs one simulator backward pass per step and saves a compilation (tens of seconds
on this CPU). In self-play one set of weights plays both roles: the rollout's simulator is the agent's
parameters, the train step's `self_play` sums both roles' gradients into them, at the agent's rate.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from scope_jax.algorithms import ADVANTAGES, token_mean
from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.training.batch import Batch, RoleBatch, TokenBatch
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.state import JointState
from scope_jax.training.train_step import TrainStepConfig, make_train_step


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """steps must be a multiple of eval_every; groups a multiple of the arm's members. rotation_block:
    steps each simulator of a rotation answers before the next one takes over. best_response_every:
    the regret objective's best response is solved at the steps t with t % best_response_every = 0."""

    steps: int = 100
    eval_every: int = 50
    groups: int = 8
    group_size: int = 12
    learning_rate: float = 1e-3
    sim_learning_rate: float = 2e-3  # with sim_kl_coef, chosen from the :sweep by the stated rule
    sim_kl_coef: float = 1.0  # the rule is stated in docs/results/README.md, before the sweep ran
    rotation_block: int = 1
    advantage: str = "grpo"
    best_response_every: int = 1

    @property
    def episodes(self) -> int:
        return self.groups * self.group_size


DATA_STREAM = 1 << 20  # folded into a step's key for the data anchor's rows
BEST_RESPONSE_STREAM = 1 << 21  # folded into a step's key for the best response's episodes


class AnchorData(NamedTuple):
    """Each member's data anchor dialogues in the simulator's view, padded to a fixed number of rows."""

    tokens: jax.Array  # [P, D, L] int32
    loss_mask: jax.Array  # [P, D, L] float: 1 on the simulator's replies
    rows: jax.Array  # [P] int32: the rows that hold member p's dialogues (the first `rows[p]`)


class ArmInputs(NamedTuple):
    """What differs between the arms of one compiled program (unbatched over seeds)."""

    cards: jax.Array  # [P] int32: the prompt card of each slot
    voices: jax.Array  # [steps, P] int32: the member answering slot p's block at step t
    verbalized: jax.Array  # [] bool: simulators answer by Verbalized Sampling
    sim_learning_rate: jax.Array  # [] float: 0 keeps the simulators frozen (unused in self-play)
    sim_sign: jax.Array  # [] float: the simulators' reward is sim_sign x the agent's (-1: adversarial)
    data: AnchorData | None = None  # the data anchor's dialogues (programs with data_coef > 0)


class StepLog(NamedTuple):
    """Per step (leading axes [R, steps] after the run)."""

    reward: jax.Array  # mean training reward
    rewards: jax.Array  # [B] every episode's reward (zero-variance groups are counted on the host)
    agent_entropy: jax.Array  # train step: mean entropy of the agent's act distribution at its decisions
    sampled_deviation: jax.Array  # mean 1 - p_max of the distributions the replies were drawn from
    early_ask: jax.Array  # fraction of episodes that request the donation before it is forced
    vs_malformed: jax.Array  # fraction of verbalization attempts that fell back to direct sampling
    vs_repaired: jax.Array  # fraction of used verbalizations that needed repair
    skipped: jax.Array  # non-finite step, not applied


class Snapshots(NamedTuple):
    agent: Any  # agent params at the end of each chunk of eval_every steps: [R, E, ...]
    sims: Any  # the simulators' params [R, E, P, ...] (self-play: the agent's, P = 1)


class Program(NamedTuple):
    """One compiled RL program and the pieces it is made of (single seed, not jitted)."""

    run: Callable  # jit(vmap): (agent [R], sims [R, P], refs [R, P], ArmInputs, keys [R])
    #                  -> (final JointState [R], StepLog [R, steps], Snapshots)
    init: Callable  # (agent, sims [P], refs [P], key) -> JointState
    batch: Callable  # (lm.Dialogues, sim_sign, sim_data, best-response lm.Dialogues) -> Batch
    step_batch: Callable  # (JointState, step key, t, ArmInputs) -> (the agent's lm.Dialogues, Batch)
    anchor: Callable  # (AnchorData, step key) -> the data anchor's TokenBatch [P, M, L]
    train_step: Callable  # (JointState, Batch) -> (JointState, metrics)


@functools.cache
def make_runner(agent_graphdef: nnx.GraphDef, sim_graphdef: nnx.GraphDef, config: RLConfig, members: int,
                sim_kl_coef: float, self_play: bool = False, data_coef: float = 0.0,
                best_response: bool = False) -> Program:
    """The RL program of arms with `members` simulators, simulator KL weight `sim_kl_coef` and data
    anchor weight `data_coef` (cached: arms and runs of one shape share it). In self-play `sims` is
    unused (pass the agent's, [R, 1]) and refs[:, 0] is the simulator role's KL reference.
    best_response: the simulators' batch also holds the best response's episodes (regret)."""
    if config.groups % members or config.steps % config.eval_every:
        raise ValueError("groups must divide into members and steps into eval_every chunks")
    if self_play and members != 1:
        raise ValueError("self-play has one simulator: the agent itself")
    if self_play and data_coef:
        raise ValueError("the data anchor is the simulators' (self-play has none of its own)")
    if self_play and best_response:
        raise ValueError("the regret objective is the simulators' (self-play has none of its own)")
    if config.best_response_every < 1:
        raise ValueError("best_response_every must be at least 1")
    per_member = config.episodes // members
    optimizer = make_optimizer(OptimizerConfig(learning_rate=config.learning_rate, sim_learning_rate=1.0),
                               {"agent": True} if self_play else {"agent": True, "sims": True})
    step_config = TrainStepConfig(agent=LossConfig(allowed_tokens=lm.AGENT_ACTS),
                                  sims=LossConfig(kl_coef=sim_kl_coef, allowed_tokens=lm.REPLY_ACTS,
                                                  data_coef=data_coef),
                                  self_play=self_play)
    train_step = make_train_step(agent_graphdef, sim_graphdef, optimizer, step_config)
    advantage = ADVANTAGES[config.advantage]
    group_ids = jnp.arange(config.episodes) // config.group_size

    def anchor(data: AnchorData, key) -> TokenBatch:
        """[members, M, L]: M rows of each member's data, drawn with replacement."""
        chex.assert_shape(data.rows, (members,))
        rows = jax.random.randint(jax.random.fold_in(key, DATA_STREAM), (members, per_member), 0,
                                  data.rows[:, None])
        tokens = jnp.take_along_axis(data.tokens, rows[..., None], axis=1)
        mask = jnp.take_along_axis(data.loss_mask, rows[..., None], axis=1)
        return TokenBatch(tokens, lm.positions_like(tokens), mask)

    def sim_role(d: lm.Dialogues, rewards: jax.Array) -> RoleBatch:
        """[P, M, L]: the simulators' view of d, with the GRPO advantages of `rewards` [B]."""
        adv = advantage(rewards, group_ids, config.groups).reshape(members, per_member)
        return RoleBatch(d.sim_tokens, lm.positions_like(d.sim_tokens), d.sim_mask, d.sim_logprobs, adv)

    def batch(d: lm.Dialogues, sim_sign: jax.Array, sim_data: TokenBatch | None = None,
              best: lm.Dialogues | None = None) -> Batch:
        agent = RoleBatch(d.tokens, lm.positions_like(d.tokens), d.agent_mask, d.agent_logprobs,
                          advantage(d.rewards, group_ids, config.groups))
        sims = sim_role(d, sim_sign * d.rewards)
        if best is not None:  # regret: + the best response's reward on its own episodes
            responded = sim_role(best, best.rewards)
            sims = jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=1), sims, responded)
        return Batch(agent=agent, sims=sims, sim_data=sim_data)

    def best_responses(voiced, inputs: ArmInputs) -> jax.Array:
        """[P, N_STATES, N_AGENT]: the exact best response to each voiced member's current replies."""
        return lm.best_response(jax.vmap(lm.sim_reply_table, in_axes=(None, 0, 0))(sim_graphdef, voiced,
                                                                                    inputs.cards))

    def best_response_episodes(best: jax.Array, voiced, inputs: ArmInputs, key) -> lm.Dialogues:
        """M episodes per member, played by the best response tables `best` against it."""
        return lm.play(lm.table_agent(best, per_member), sim_graphdef, voiced, inputs.cards,
                       inputs.verbalized, jax.random.fold_in(key, BEST_RESPONSE_STREAM), members, per_member)

    def simulators(state: JointState):
        return jax.tree.map(lambda x: x[None], state.params["agent"]) if self_play else state.params["sims"]

    def init(agent, sims, refs, key) -> JointState:
        params = {"agent": agent} if self_play else {"agent": agent, "sims": sims}
        role = "agent" if self_play else "sims"
        ref = jax.tree.map(lambda x: x[0], refs) if self_play else refs
        return JointState(params=params, ref_params={role: ref} if sim_kl_coef else {},
                          opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32),
                          rng=jax.random.key_data(key))

    def refreshed(best: jax.Array | None, state: JointState, t, inputs: ArmInputs) -> jax.Array | None:
        """The best response tables for step t: solved anew when t % best_response_every = 0."""
        if not best_response:
            return None
        voiced = jax.tree.map(lambda x: x[inputs.voices[t]], simulators(state))
        return jax.lax.cond(t % config.best_response_every == 0, lambda: best_responses(voiced, inputs),
                            lambda: best)

    def step_batch(state: JointState, key, t, inputs: ArmInputs,
                   best: jax.Array | None = None) -> tuple[lm.Dialogues, Batch]:
        """best: the best response tables [P, N_STATES, N_AGENT] of a regret program (None: solved here)."""
        voiced = jax.tree.map(lambda x: x[inputs.voices[t]], simulators(state))
        d = lm.rollout(agent_graphdef, state.params["agent"], sim_graphdef, voiced, inputs.cards,
                       inputs.verbalized, key, members, per_member)
        sim_data = anchor(inputs.data, key) if data_coef else None
        if best_response and best is None:
            best = best_responses(voiced, inputs)
        episodes = best_response_episodes(best, voiced, inputs, key) if best_response else None
        return d, batch(d, inputs.sim_sign, sim_data, episodes)

    def one_step(state: JointState, key, t, inputs: ArmInputs, best: jax.Array | None):
        d, step = step_batch(state, key, t, inputs, best)
        new, metrics = train_step(state, step)
        if not self_play:
            rate = inputs.sim_learning_rate
            moved = jax.tree.map(lambda n, o: jnp.where(rate > 0, o + rate * (n - o), o),
                                 new.params["sims"], state.params["sims"])
            new = new.replace(params={**new.params, "sims": moved})
        tried = d.replied & inputs.verbalized
        log = StepLog(
            reward=d.rewards.mean(), rewards=d.rewards, agent_entropy=metrics["agent/entropy"],
            sampled_deviation=token_mean(1.0 - d.sim_pmax, d.replied),
            early_ask=jnp.mean(d.tokens[:, -1] != lm.ASK_TOKEN),
            vs_malformed=token_mean(d.malformed, tried),
            vs_repaired=token_mean(d.repaired, d.verbalized),
            skipped=metrics["skipped"])
        return new, log

    def run_seed(agent, sims, refs, inputs: ArmInputs, key):
        chex.assert_shape(inputs.voices, (config.steps, members))
        state = init(agent, sims, refs, key)

        def chunk(carry, chunk_index):
            def body(carry, i):
                state, best = carry
                t = chunk_index * config.eval_every + i
                best = refreshed(best, state, t, inputs)
                state, log = one_step(state, jax.random.fold_in(key, t), t, inputs, best)
                return (state, best), log

            (state, best), logs = jax.lax.scan(body, carry, jnp.arange(config.eval_every))
            return (state, best), (logs, Snapshots(state.params["agent"], simulators(state)))

        best0 = (jnp.zeros((members, personas.N_STATES, personas.N_AGENT), jnp.float32)
                 if best_response else None)
        (state, _), (logs, snapshots) = jax.lax.scan(chunk, (state, best0),
                                                     jnp.arange(config.steps // config.eval_every))
        logs = jax.tree.map(lambda x: x.reshape(config.steps, *x.shape[2:]), logs)
        return state, logs, snapshots

    run = jax.jit(jax.vmap(run_seed, in_axes=(0, 0, 0, None, 0)))
    return Program(run, init, batch, step_batch, anchor, train_step)


def arm_inputs(cards, voices, verbalized: bool, sim_learning_rate: float, sim_sign: float,
               data: TokenBatch | None = None, rows=None) -> ArmInputs:
    """data: each member's anchor dialogues [P, D, L] (member p's in its first `rows[p]` rows), or None."""
    anchor = None if data is None else AnchorData(jnp.asarray(data.tokens, jnp.int32),
                                                  jnp.asarray(data.loss_mask, jnp.float32),
                                                  jnp.asarray(rows, jnp.int32))
    return ArmInputs(jnp.asarray(cards, jnp.int32), jnp.asarray(voices, jnp.int32), jnp.asarray(verbalized),
                     jnp.asarray(sim_learning_rate, jnp.float32), jnp.asarray(sim_sign, jnp.float32), anchor)
