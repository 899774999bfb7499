"""The settings of a dialogue RL run (`default_config`) and the combinations it refuses (`check`).

Every key has its default here; a config file starts from them and changes values (`scope_jax.config`
refuses unknown keys and wrong types). `check` then refuses, before any work and in one line naming the
key, what would run but be wrong: sampling the trained roles cannot reproduce in the loss, simulator
keys the mode does not read, population groups too small for an advantage, batch rows that do not
split over the mesh or the micro-batches, and more (see `check`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import NamedTuple

import jax
import ml_collections

from scope_jax import distributed, envs, sharding
from scope_jax.algorithms import ADVANTAGES, AGGREGATIONS, GROUP_SIZE, KL_ESTIMATORS
from scope_jax.config import (FINITE, FINITE_AT_LEAST_0, PROBABILITY, ConfigError, Rule, at_least, one_of,
                              require)
from scope_jax.dialogue.environment import Environment
from scope_jax.envs import user_dialogues
from scope_jax.envs.cooperbench.sandbox import SandboxError
from scope_jax.envs.p4g_csv import P4GDataError
from scope_jax.envs.tau2.tasks import Tau2DataError
from scope_jax.simulators.modes import SimulatorMode, make_mode
from scope_jax.simulators.verbalized import VerbalizedConfig, verbalized_config
from scope_jax.training import monitor, players
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import NAMES as OPTIMIZERS
from scope_jax.training.optimizer import OptimizerConfig


def default_config() -> ml_collections.ConfigDict:
    """Every setting of a dialogue RL run, with its default."""
    c = ml_collections.ConfigDict()
    c.experiment = "dialogue_rl"
    c.seed = 0
    c.env = env_settings("target_word")  # a config file of another environment replaces the group
    # dtype and max_context hold for every model; remat (recompute each layer in the backward pass: less
    # activation memory, about a third more compute) for the agent's model, and in self-play both roles'.
    c.agent = ml_collections.ConfigDict({"model": "tiny:0", "dtype": "float32", "max_context": 512,
                                         "remat": False})
    c.sim = ml_collections.ConfigDict({
        "mode": "frozen",          # see scope_jax.simulators.modes
        "remat": False,            # remat for the simulator models (it matters where they train)
        "model": "tiny:1",         # the simulator (population: member p is "tiny:SEED+p" of a tiny spec)
        "population": 1,           # P, for mode population
        "models": (),              # the frozen simulators of modes rotation and mixture
        "objective": "adversarial",  # a trained simulator's reward: "adversarial" or "cooperative"
        "data_coef": 0.0,          # weight of the data anchor: the NLL of user dialogues in the simulators' loss
        "data": "",                # its user dialogues, SOURCE:SPLIT (training.data_anchor)
    })
    c.verbalized = ml_collections.ConfigDict(
        dict(dataclasses.asdict(VerbalizedConfig()), max_new_tokens=128))
    c.sampling = ml_collections.ConfigDict({"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                            "max_new_tokens": 8})
    # kv_cache: model speakers keep per-row KV caches across a rollout's turns (False: re-prefill each turn).
    # shards: the step's groups (and evaluation groups, monitor probes) are played as this many rollouts,
    # shared by the processes of a multi-process job (scope_jax.distributed; a multiple of their number)
    c.rollout = ml_collections.ConfigDict({"groups": 4, "group_size": 4, "kv_cache": True, "shards": 1})
    c.algo = ml_collections.ConfigDict({
        "advantage": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "dual_clip": 0.0,
        "aggregation": "token_mean", "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0,
        "sim_kl_coef": 0.1,  # the KL anchor of a trained simulator to its initial policy
    })
    c.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
    c.train = ml_collections.ConfigDict({
        "steps": 30, "microbatches": 1, "eval_every": 10, "eval_groups": 4, "checkpoint_every": 10,
        "max_consecutive_skips": 3, "samples": 4,  # transcripts written at each eval: samples/step-S.jsonl
        "eval_first": False,  # evaluate before the first update too: the untrained agent's baseline
    })
    c.eval = ml_collections.ConfigDict({"sim_models": ("tiny:101",)})
    c.monitor = ml_collections.ConfigDict(dataclasses.asdict(monitor.MonitorConfig()))
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    return c


def env_settings(name: str) -> ml_collections.ConfigDict:
    """The `env` group of environment `name`: its name and every setting of its class, at the class's
    defaults (the first speaker is the environment's own; a setting without a plain default, such as a
    judge object, is not a config key)."""
    fields = dataclasses.fields(envs.ENVIRONMENTS[name])
    return ml_collections.ConfigDict({"name": name, **{
        f.name: f.default for f in fields
        if f.init and f.name != "first_speaker" and f.default not in (dataclasses.MISSING, None)}})


def schema(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The keys and types `config` may have: `default_config` with the env group of its environment."""
    c = default_config()
    name = config.get("env", {}).get("name")
    if name in envs.ENVIRONMENTS:
        c.env = env_settings(name)
    return c


# What each value must be whatever else is set; `check` applies them first (later checks divide by counts).
RULES: dict[str, Rule] = {
    "train.steps": at_least(1), "train.microbatches": at_least(1), "train.eval_every": at_least(0),
    "rollout.groups": at_least(1), "rollout.shards": at_least(1),
    "rollout.group_size": GROUP_SIZE,
    "algo.advantage": one_of(ADVANTAGES), "algo.aggregation": one_of(AGGREGATIONS),
    "algo.kl_estimator": one_of(KL_ESTIMATORS), "agent.dtype": one_of(players.DTYPES),
    "optimizer.name": one_of(OPTIMIZERS),
    "sampling.temperature": FINITE_AT_LEAST_0, "sampling.top_k": at_least(0), "sampling.top_p": PROBABILITY,
    **dict.fromkeys(("optimizer.learning_rate", "optimizer.sim_learning_rate", "optimizer.max_grad_norm",
                     "optimizer.weight_decay", "algo.kl_coef", "algo.sim_kl_coef", "sim.data_coef"),
                    FINITE_AT_LEAST_0),
    "algo.entropy_coef": FINITE,  # below 0: an entropy penalty
}


class Checked(NamedTuple):
    """What `check` built while checking a config, for the run to use rather than build again."""

    mode: SimulatorMode
    env: Environment


def check(config: ml_collections.ConfigDict) -> Checked:
    """Refuse impossible or silently wrong combinations before any work (ConfigError, one line naming the
    key); returns the simulator mode and the environment, the run's own (its one construction)."""
    require(config, RULES)
    if config.train.eval_every or config.train.eval_first:
        require(config, {"train.eval_groups": at_least(1)})
    try:
        verbalized_config(config.verbalized)
    except ValueError as e:
        raise ConfigError(f"config group 'verbalized': {e}") from None
    mode = make_mode(config)
    _check_sampling(config)
    if config.train.checkpoint_every < 1:
        raise ConfigError(f"config key 'train.checkpoint_every' is {config.train.checkpoint_every}; it must "
                          "be at least 1 (the last step is always saved)")
    _check_rows(config, mode)
    _check_shards(config)
    _check_fits(config)
    _check_models(config)
    return Checked(mode, make_env(config.env))  # a missing or malformed data file stops the run here


def _check_sampling(config) -> None:
    """The agent always trains: its tokens must be sampled from the distribution the loss recomputes,
    the model's softmax at the sampling temperature (top-k / top-p truncate it, temperature 0 is argmax)."""
    sampling = config.sampling
    why = ("the agent trains on its samples, and the loss's log-probs (the whole softmax at the sampling "
           "temperature) would not be the sampler's")
    for key, wrong in (("temperature", sampling.temperature <= 0), ("top_k", sampling.top_k > 0),
                       ("top_p", sampling.top_p < 1)):
        if wrong:
            raise ConfigError(f"config key 'sampling.{key}' is {sampling[key]}; {why}")


def _check_rows(config, mode: SimulatorMode) -> None:
    """Each trained role's rows per micro-batch (per population member) split evenly over the mesh."""
    episodes, microbatches = config.rollout.groups * config.rollout.group_size, config.train.microbatches
    try:
        mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
        distributed.local_mesh(mesh)
    except ValueError as e:
        raise ConfigError(f"config group 'mesh': {e}") from None
    shards = sharding.data_parallel_size(mesh)
    members = mode.members if mode.sim_trains else 1
    for what, rows in (("agent rows", episodes), ("rows per simulator", episodes // members)):
        if rows % microbatches or (rows // microbatches) % shards:
            raise ConfigError(
                f"config key 'rollout.groups' x 'rollout.group_size' gives {rows} {what}, which do not split "
                f"into train.microbatches = {microbatches} micro-batches of a multiple of mesh.data x "
                f"mesh.fsdp = {shards} rows")


def _check_shards(config) -> None:
    """Every shared piece of work splits into rollout.shards whole shards, and those over the processes."""
    shards = config.rollout.shards
    for key, n, what in (("rollout.groups", config.rollout.groups, "scenario groups"),
                         ("train.eval_groups", config.train.eval_groups, "evaluation groups"),
                         ("monitor.probe_contexts", config.monitor.probe_contexts, "probe contexts"),
                         ("monitor.fork_contexts", config.monitor.fork_contexts, "fork contexts")):
        why = distributed.refusal(what, n, shards, jax.process_count())
        if why:
            raise ConfigError(f"config key '{key}' or 'rollout.shards': {why} (each process plays whole "
                              "shards; see docs/distributed.md)")


def _check_fits(config) -> None:
    """The judge and the training simulators are fitted on disjoint people (`envs.user_dialogues`): the data
    anchor draws from the simulator split, a fitted training simulator was fitted on it, a fitted held-out
    simulator (the judge) on the judge split, and no fitted model is both trained against and the judge."""
    if config.sim.data:
        try:
            user_dialogues.check_fit(config.sim.data, "simulator")
        except ValueError as e:
            raise ConfigError(f"config key 'sim.data': {e}") from None
    judges = set(config.eval.sim_models)
    roles = [("sim.model", config.sim.model, "simulator")] + [("sim.models", s, "simulator")
                                                               for s in config.sim.models]
    for key, spec, purpose in roles + [("eval.sim_models", s, "judge") for s in config.eval.sim_models]:
        if "+" in spec and not pathlib.Path(spec.split("+", 1)[1]).is_dir():
            raise ConfigError(f"config key '{key}' is {spec!r}, but its adapter folder does not exist (fit "
                              "it first; docs/sft.md)")
        fit = user_dialogues.recorded_fit(spec)
        if fit is not None and fit["purpose"] != purpose:
            raise ConfigError(f"config key '{key}' is {spec!r}, fitted as the {fit['purpose']} on "
                              f"{fit['data']}; a {purpose} here must be fitted as one (docs/p4g.md)")
    for key, spec, _ in roles:
        if "+" in spec and spec in judges:
            raise ConfigError(f"config key '{key}' is {spec!r}, also the judge (eval.sim_models): the agent "
                              "would train against the model that evaluates it")


def _check_models(config) -> None:
    """Every model spec names a model (without loading it): a missing one would stop the run only after its
    directory is made."""
    players.check_specs([("agent.model", config.agent.model), ("sim.model", config.sim.model)]
                        + [("sim.models", spec) for spec in config.sim.models]
                        + [("eval.sim_models", spec) for spec in config.eval.sim_models])


def make_env(env_config: ml_collections.ConfigDict) -> Environment:
    """The environment `env_config.name` with the group's settings (`env_settings`' keys)."""
    if env_config.name not in envs.ENVIRONMENTS:
        raise ConfigError(f"config key 'env.name' is {env_config.name!r}; "
                          f"one of {', '.join(envs.ENVIRONMENTS)}")
    try:
        return envs.make(env_config.name, **{k: v for k, v in env_config.items() if k != "name"})
    except (P4GDataError, Tau2DataError) as e:
        raise ConfigError(f"config key 'env.data_dir': {e}") from None
    except (OSError, ValueError, SandboxError) as e:  # SandboxError: the sandbox cannot run here
        raise ConfigError(f"config group 'env': {e}") from None


def loss_config(config: ml_collections.ConfigDict, kl_coef: float, data_coef: float = 0.0) -> LossConfig:
    """The loss settings of one role (its KL weight `kl_coef`, data anchor weight `data_coef`) from the
    `algo` and `sampling` groups."""
    algo = config.algo
    return LossConfig(epsilon_low=algo.epsilon_low, epsilon_high=algo.epsilon_high,
                      dual_clip=algo.dual_clip or None, aggregation=algo.aggregation, kl_coef=kl_coef,
                      kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef,
                      temperature=config.sampling.temperature, data_coef=data_coef)
