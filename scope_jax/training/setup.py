"""Everything a dialogue RL run builds once from its config and from what its check built (the environment
and the simulator mode, `training.config.check`): players, state, train step.

The simulator mode (`scope_jax.simulators.modes`) says which models its simulator side needs and which
parameters train; this module loads those models onto the run's mesh, puts the agent's and the stacked
simulators' parameters into one joint state, labels the optimizer's frozen parts, keeps a KL reference
for each role with a KL weight, and builds the one train step.

In a multi-process job the state and the train step live on the global mesh, and each process plays its
rollouts on its own part of it (`rollout_mesh`): the players hold views of their parameters there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from scope_jax import distributed, sharding
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.speakers import Player
from scope_jax.sampling import SamplingConfig
from scope_jax.simulators.modes import SimulatorMode, SimulatorModels
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch
from scope_jax.training.config import Checked, check, loss_config
from scope_jax.training.data_anchor import DataAnchor
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.players import adapter_hashes, load_model
from scope_jax.training.train_step import TrainStep, TrainStepConfig, compile_train_step, make_train_step


@dataclasses.dataclass
class Setup:
    """The run's fixed parts. `agent` and the models in `sims` hold their initial parameters; the current
    ones are the joint state's. `state` is the initial joint state; `update` is the compiled train step.
    The players generate on `rollout_mesh`, this process's devices of `mesh` (all of it in a 1-process
    run), with their parameters viewed there."""

    config: ml_collections.ConfigDict
    env: Environment
    mode: SimulatorMode
    agent: Player
    sims: SimulatorModels
    eval_sims: list[Player]
    state: joint.JointState
    train_step: TrainStep
    step_config: TrainStepConfig
    mesh: jax.sharding.Mesh  # the state and the train step's batch sit on it
    rollout_mesh: jax.sharding.Mesh  # the players' generate calls shard rows over it
    anchor: DataAnchor | None = None  # the simulators' data anchor (sim.data_coef > 0)
    adapters: dict[str, str] = dataclasses.field(default_factory=dict)  # {base+adapter spec: its sha256}
    _compiled: Any = None

    def rollout_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """A joint state's `params` as the players use them, on `rollout_mesh` (no copy)."""
        return distributed.local_view(params, self.rollout_mesh)

    def update(self, state: joint.JointState, batch: Batch) -> tuple[joint.JointState, dict[str, Any]]:
        """The jitted train step on the mesh (compiled at its first batch; the state is donated)."""
        if self._compiled is None:
            self._compiled = compile_train_step(self.train_step, state, batch, self.mesh)
        return self._compiled(state, batch)


def build(config: ml_collections.ConfigDict, checked: Checked | None = None) -> Setup:
    """The run's setup; `checked` is what `check(config)` returned (checked here when not given)."""
    mode, env = checked if checked is not None else check(config)
    words = getattr(env, "vocabulary", ())
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    loaded: list[str] = []  # every model spec the run loads, for `adapters`

    def player(spec: str, remat: bool = False) -> Player:
        loaded.append(spec)
        graphdef, params, tokenizer = load_model(spec, words=words, dtype=config.agent.dtype, remat=remat,
                                                 mesh=mesh)
        sampling = SamplingConfig(
            temperature=config.sampling.temperature, top_k=config.sampling.top_k, top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,),
            pad_token_id=tokenizer.pad_token_id or 0)
        return Player(graphdef, params, tokenizer, sampling, config.agent.max_context, mesh,
                      kv_cache=config.rollout.kv_cache)

    agent = player(config.agent.model, config.agent.remat)
    members = [player(spec, config.sim.remat) for spec in mode.member_specs()]
    stacked = None
    params = {"agent": agent.params}
    if members:
        params["sims"] = joint.stack_population([m.params for m in members])
        stacked = dataclasses.replace(members[0], params=params["sims"])
    listed = tuple(player(spec, config.sim.remat) for spec in mode.listed_specs())
    sims = SimulatorModels(agent, stacked, listed)
    eval_sims = [player(spec) for spec in config.eval.sim_models]

    optimizer = make_optimizer(OptimizerConfig(**config.optimizer.to_dict()),
                               {group: group in mode.trained for group in params})
    ref_roles = {"agent"} if config.algo.kl_coef else set()
    if config.algo.sim_kl_coef and mode.sim_trains:
        ref_roles.add(mode.sim_params)
    state = joint.create(params, optimizer, seed=config.seed, ref_roles=tuple(sorted(ref_roles)))
    step_config = TrainStepConfig(
        agent=loss_config(config, config.algo.kl_coef),
        sims=loss_config(config, config.algo.sim_kl_coef, config.sim.data_coef) if mode.sim_trains else None,
        self_play=mode.sim_params == "agent", microbatches=config.train.microbatches)
    trained_sim = mode.sim_player(sims)
    sim_graphdef = trained_sim.graphdef if trained_sim is not None else None
    step = make_train_step(agent.graphdef, sim_graphdef, optimizer, step_config)
    rollout_mesh = distributed.local_mesh(mesh)
    local = lambda p: p if p is None else dataclasses.replace(
        p, params=distributed.local_view(p.params, rollout_mesh), mesh=rollout_mesh)
    sims = SimulatorModels(local(sims.agent), local(sims.members), tuple(map(local, sims.listed)))
    anchor = (DataAnchor.load(config.sim.data, env, trained_sim.tokenizer, config.seed)
              if config.sim.data_coef else None)
    return Setup(config, env, mode, local(agent), sims, [local(p) for p in eval_sims], state, step,
                 step_config, mesh, rollout_mesh, anchor, adapter_hashes(loaded))
