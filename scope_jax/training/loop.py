"""The host loop of multi-turn agent-simulator RL.

Each step: sample scenarios -> roll out groups of episodes (agent vs. simulators) -> rewards ->
group-relative advantages per role -> one jitted train step on the joint state -> log. Every
`eval_every` steps the agent plays held-out simulators and the collapse monitor runs its costly
estimates; every `checkpoint_every` steps the whole state is saved. Scenarios and rollout keys of step
s are functions of (seed, s) only, so a run resumed from a checkpoint repeats exactly the steps an
uninterrupted run would have taken.

Simulator modes (`sim.mode`) are configurations of this one loop and its one train step:
  frozen      one simulator, never updated (params["sims"] with P = 1, label "frozen")
  verbalized  a frozen simulator answering by Verbalized Sampling
  cotrain     one simulator trained on the same episodes (own mask, own advantages, KL anchor)
  population  P simulators of one architecture, stacked, trained; generation and loss vmapped over P
  rotation    several frozen simulators (any architecture / tokenizer) taken in turn per episode or step
  selfplay    one set of weights plays both roles (params has no "sims")
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from scope_jax import envs, sharding
from scope_jax.config import ConfigError
from scope_jax.dialogue.batching import final_view, group_advantages, pad_views, population_batch
from scope_jax.dialogue.episode import AGENT, ROLES, SIM, Episode
from scope_jax.dialogue.rollout import (Player, SimTurn, members_turn, population_turn, rollout,
                                        verbalized_turn)
from scope_jax.sampling import SamplingConfig
from scope_jax.simulators.verbalized import VerbalizedConfig, VerbalizedSampler
from scope_jax.training import monitor
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch
from scope_jax.training.checkpoint import Checkpointer, config_fingerprint
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train_step import TrainStepConfig, compile_train_step, make_train_step

log = logging.getLogger(__name__)

SIM_MODES = ("frozen", "verbalized", "cotrain", "population", "rotation", "selfplay")
TRAINED_SIM_MODES = ("cotrain", "population", "selfplay")


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


def default_config() -> ml_collections.ConfigDict:
    """Every setting of a dialogue RL run, with its default."""
    c = ml_collections.ConfigDict()
    c.experiment = "dialogue_rl"
    c.seed = 0
    # The settings of every environment; each takes those its class has (see make_env).
    c.env = ml_collections.ConfigDict({"name": "target_word", "max_turns": 2,
                                       "data_dir": "../shared/data/p4g"})
    # dtype and max_context hold for every model; remat (recompute each layer in the backward pass: less
    # activation memory, about a third more compute) for the agent's model, and in self-play both roles'.
    c.agent = ml_collections.ConfigDict({"model": "tiny:0", "dtype": "float32", "max_context": 512,
                                         "remat": False})
    c.sim = ml_collections.ConfigDict({
        "mode": "frozen",          # see SIM_MODES
        "remat": False,            # remat for the simulator models (it matters where they train)
        "model": "tiny:1",         # population member p is "tiny:SEED+p" for tiny specs, else the same model
        "population": 1,           # P, for mode population
        "models": ("tiny:1", "tiny:2"),  # the frozen simulators of mode rotation
        "rotation": "episode",     # rotation schedule: "episode" (round robin) or "step"
        "objective": "shared",     # trained simulators: "shared" (the agent's reward) or "adversarial"
        "assignment": "round_robin",  # episodes -> population members: "round_robin" or "random" (balanced)
    })
    c.verbalized = ml_collections.ConfigDict(
        dict(dataclasses.asdict(VerbalizedConfig()), max_new_tokens=128))
    c.sampling = ml_collections.ConfigDict({"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                            "max_new_tokens": 8})
    c.rollout = ml_collections.ConfigDict({"groups": 4, "group_size": 4})
    c.algo = ml_collections.ConfigDict({
        "advantage": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "dual_clip": 0.0,
        "aggregation": "token_mean", "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0,
        "sim_kl_coef": 0.0,
    })
    c.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
    c.train = ml_collections.ConfigDict({
        "steps": 30, "microbatches": 1, "eval_every": 10, "eval_groups": 4, "checkpoint_every": 10,
        "max_consecutive_skips": 3, "samples": 4,  # transcripts written at each eval: samples/step-S.jsonl
    })
    c.eval = ml_collections.ConfigDict({"sim_models": ("tiny:101",)})
    c.monitor = ml_collections.ConfigDict(dataclasses.asdict(monitor.MonitorConfig()))
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    return c


def check(config: ml_collections.ConfigDict) -> None:
    """Impossible combinations stop the run before any work, naming the key."""
    if config.sim.mode not in SIM_MODES:
        raise ConfigError(f"config key 'sim.mode' is {config.sim.mode!r}; one of {', '.join(SIM_MODES)}")
    if config.sim.mode != "population" and config.sim.population != 1:
        raise ConfigError("config key 'sim.population' must be 1 unless sim.mode is 'population'")
    if config.sim.objective not in ("shared", "adversarial"):
        raise ConfigError(f"config key 'sim.objective' is {config.sim.objective!r}; "
                          "one of shared, adversarial")
    if config.sim.rotation not in ("episode", "step"):
        raise ConfigError(f"config key 'sim.rotation' is {config.sim.rotation!r}; one of episode, step")
    if config.sim.assignment not in ("round_robin", "random"):
        raise ConfigError(f"config key 'sim.assignment' is {config.sim.assignment!r}; "
                          "one of round_robin, random")
    episodes = config.rollout.groups * config.rollout.group_size
    if episodes % (simulator_count(config) * config.train.microbatches):
        raise ConfigError("config key 'rollout.groups' x 'rollout.group_size' must be a multiple of the "
                          "number of simulators x train.microbatches")
    try:
        verbalized_config(config)
    except ValueError as e:
        raise ConfigError(f"config group 'verbalized': {e}") from None
    make_env(config.env)  # a missing or malformed data file stops the run here, in one line


def verbalized_config(config: ml_collections.ConfigDict) -> VerbalizedConfig:
    """The `verbalized` group as a VerbalizedConfig (its max_new_tokens is the sampler's budget, not a
    field of the config); raises ValueError on a bad setting."""
    return VerbalizedConfig(**{k: v for k, v in config.verbalized.items() if k != "max_new_tokens"})


def make_env(env_config: ml_collections.ConfigDict) -> envs.Environment:
    """The environment `env_config.name` with the settings of the group that its class takes."""
    if env_config.name not in envs.ENVIRONMENTS:
        raise ConfigError(f"config key 'env.name' is {env_config.name!r}; "
                          f"one of {', '.join(envs.ENVIRONMENTS)}")
    takes = inspect.signature(envs.ENVIRONMENTS[env_config.name]).parameters
    try:
        return envs.make(env_config.name, **{k: v for k, v in env_config.items() if k in takes})
    except (OSError, ValueError) as e:
        raise ConfigError(f"config group 'env': {e}") from None


def simulator_count(config) -> int:
    """How many simulators share a step's episodes (population members or rotated models)."""
    if config.sim.mode == "population":
        return config.sim.population
    if config.sim.mode == "rotation" and config.sim.rotation == "episode":
        return len(config.sim.models)
    return 1


def _loss_config(config, kl_coef: float) -> LossConfig:
    algo = config.algo
    return LossConfig(epsilon_low=algo.epsilon_low, epsilon_high=algo.epsilon_high,
                      dual_clip=algo.dual_clip or None, aggregation=algo.aggregation, kl_coef=kl_coef,
                      kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef,
                      temperature=config.sampling.temperature)


@dataclasses.dataclass
class Setup:
    """Everything built once from the config.

    agent / sim: players whose params are replaced by the current state's before each rollout (`sim`
    holds stacked [P] params; None in rotation and self-play). rotation: fixed frozen simulators.
    """

    env: Any
    agent: Player
    sim: Player | None
    rotation: list[Player]
    eval_sims: list[Player]
    verbalizer: VerbalizedSampler | None
    verbalizer_tokens: int
    state: joint.JointState
    train_step: Any
    step_config: TrainStepConfig
    mesh: jax.sharding.Mesh  # every player's parameters sit on it, and its generate calls shard rows over it


def build(config: ml_collections.ConfigDict) -> Setup:
    env = make_env(config.env)
    words = getattr(env, "vocabulary", ())
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)

    def player(spec: str, remat: bool = False) -> Player:
        graphdef, params, tokenizer = load_model(spec, words=words, dtype=config.agent.dtype, remat=remat,
                                                 mesh=mesh)
        sampling = SamplingConfig(
            temperature=config.sampling.temperature, top_k=config.sampling.top_k, top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,),
            pad_token_id=tokenizer.pad_token_id or 0)
        return Player(graphdef, params, tokenizer, sampling, config.agent.max_context, mesh)

    mode = config.sim.mode
    agent = player(config.agent.model, config.agent.remat)
    params = {"agent": agent.params}
    sim, rotation = None, []
    if mode == "rotation":
        rotation = [player(spec, config.sim.remat) for spec in config.sim.models]
    elif mode != "selfplay":
        members = [player(_member_spec(config.sim.model, p), config.sim.remat)
                   for p in range(config.sim.population)]
        params["sims"] = joint.stack_population([m.params for m in members])
        sim = dataclasses.replace(members[0], params=params["sims"])
    eval_sims = [player(spec) for spec in config.eval.sim_models]

    trains_sims = mode in TRAINED_SIM_MODES
    roles = {role: role == "agent" or trains_sims for role in params}
    optimizer = make_optimizer(OptimizerConfig(**config.optimizer.to_dict()), roles)
    ref_roles = {"agent"} if config.algo.kl_coef else set()
    if config.algo.sim_kl_coef and trains_sims:
        ref_roles.add("agent" if mode == "selfplay" else "sims")
    state = joint.create(params, optimizer, seed=config.seed, ref_roles=tuple(sorted(ref_roles)))
    step_config = TrainStepConfig(
        agent=_loss_config(config, config.algo.kl_coef),
        sims=_loss_config(config, config.algo.sim_kl_coef) if trains_sims else None,
        self_play=mode == "selfplay", microbatches=config.train.microbatches)
    sim_graphdef = sim.graphdef if sim is not None else agent.graphdef
    step = make_train_step(agent.graphdef, sim_graphdef, optimizer, step_config)
    verbalizer = None
    if mode == "verbalized":
        verbalizer = VerbalizedSampler(verbalized_config(config))
    return Setup(env, agent, sim, rotation, eval_sims, verbalizer, config.verbalized.max_new_tokens, state,
                 step, step_config, mesh)


def _member_spec(spec: str, member: int) -> str:
    if spec.startswith("tiny:"):
        return f"tiny:{int(spec.split(':')[1]) + member}"
    return spec


@dataclasses.dataclass(frozen=True)
class Players:
    """The current players: the agent, the simulator side's turn, and one simulator model (the first
    member or rotated model) whose own reply distribution the collapse monitor probes.

    `sims` is that model, or with `stacked` a population [P, ...] whose first member it is: slicing a
    member copies its parameters, so that waits until the monitor asks for `probe_sim`.
    """

    agent: Player
    sim_turn: SimTurn
    sims: Player
    stacked: bool = False

    @functools.cached_property
    def probe_sim(self) -> Player:
        return first_member(self.sims) if self.stacked else self.sims


def first_member(sims: Player) -> Player:
    """Member 0 of a population player (params stacked [P, ...])."""
    return dataclasses.replace(sims, params=jax.tree.map(lambda x: x[0], sims.params))


def current_players(setup: Setup, state: joint.JointState) -> Players:
    """Players with the state's current parameters."""
    agent = dataclasses.replace(setup.agent, params=state.params["agent"])
    if setup.rotation:
        return Players(agent, members_turn(setup.rotation), setup.rotation[0])
    if setup.sim is None:  # self-play
        return Players(agent, members_turn([agent]), agent)
    sims = dataclasses.replace(setup.sim, params=state.params["sims"])
    if setup.verbalizer is not None:
        first = first_member(sims)
        return Players(agent, verbalized_turn(first, setup.verbalizer, setup.verbalizer_tokens), first)
    population = jax.tree.leaves(sims.params)[0].shape[0]
    return Players(agent, population_turn(sims, population), sims, stacked=True)


def make_episodes(env, config, step: int, split: str, groups: int) -> list[Episode]:
    """Episodes of step `step`: `groups` scenarios x group_size rollouts; `sim_index` assigns each to a
    population member or rotated simulator, balanced (every simulator voices as many episodes)."""
    rng = np.random.default_rng([config.seed, step, split == "eval"])
    scenarios = env.sample_scenarios(groups, rng, split=split)
    size = config.rollout.group_size
    count = simulator_count(config) if split == "train" else 1
    members = np.arange(groups * size) % count
    if config.sim.assignment == "random":
        members = rng.permutation(members)
    if config.sim.mode == "rotation" and config.sim.rotation == "step" and split == "train":
        members = np.full(groups * size, step % len(config.sim.models))
    return [Episode(scenarios[g], group=g, sim_index=int(members[g * size + k]))
            for g in range(groups) for k in range(size)]


def rollout_step(setup: Setup, config, state: joint.JointState,
                 step: int) -> tuple[Players, jax.Array, list[Episode]]:
    """The rollout of train step `step`: its episodes played to the end (rewards filled in) by the state's
    current players. Returns the players and the step's key too (evaluation and probes reuse them)."""
    players = current_players(setup, state)
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), step)
    episodes = make_episodes(setup.env, config, step, "train", config.rollout.groups)
    rollout(setup.env, episodes, players.agent, players.sim_turn, key)
    return players, key, episodes


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    rewards = np.asarray([e.rewards["agent"] for e in episodes])
    stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std()),
             "messages": float(np.mean([len(e.messages) for e in episodes]))}
    for reason in sorted({e.end_reason for e in episodes}):
        stats[f"end/{reason}"] = float(np.mean([e.end_reason == reason for e in episodes]))
    for key in sorted(set(episodes[0].rewards) - set(ROLES)):  # the environment's other outcomes
        stats[f"env/{key}"] = float(np.mean([e.rewards[key] for e in episodes]))
    return stats


def transcript(env, episode: Episode) -> dict[str, Any]:
    """An episode as plain data: what each role was told, the messages, how it ended, its rewards."""
    return {"scenario": str(episode.scenario), "group": episode.group, "sim_index": episode.sim_index,
            "system": {role: env.system_prompt(episode.scenario, role) for role in ROLES},
            "messages": [{"role": m.role, "text": m.text} for m in episode.messages],
            "end_reason": episode.end_reason, "rewards": episode.rewards}


def write_samples(run_dir: RunDir, env, step: int, episodes: list[Episode]) -> None:
    """Transcripts of `episodes` to samples/step-STEP.jsonl (rewritten when a resumed run repeats the
    step)."""
    run_dir.write_text(f"samples/step-{step}.jsonl", "".join(json.dumps(transcript(env, e)) + "\n"
                                                             for e in episodes))


def role_advantages(setup: Setup, config, episodes: list[Episode]) -> dict[str, np.ndarray]:
    """Group-relative advantages [N] from the episodes' rewards: "agent" (groups: the scenarios) and, when
    the simulators train, "sims" (groups: scenario x simulator; reward per `sim.objective`)."""
    rewards = np.asarray([e.rewards["agent"] for e in episodes], np.float32)
    groups = np.asarray([e.group for e in episodes])
    advantages = {"agent": group_advantages(rewards, groups, config.algo.advantage)}
    if setup.step_config.sims is not None:
        shared = config.sim.objective == "shared"
        sim_rewards = np.asarray([e.rewards["sim"] if shared else -e.rewards["agent"] for e in episodes],
                                 np.float32)
        sim_groups = groups * config.sim.population + np.asarray([e.sim_index for e in episodes])
        advantages["sims"] = group_advantages(sim_rewards, sim_groups, config.algo.advantage)
    return advantages


def views_batch(setup: Setup, config, episodes: list[Episode], advantages: dict[str, np.ndarray]) -> Batch:
    """The train step's batch from each trained role's final token views and its `advantages`."""
    agent = setup.agent
    agent_batch = pad_views([final_view(setup.env, e, AGENT, agent.tokenizer) for e in episodes],
                            advantages["agent"], agent.sampling.pad_token_id)
    if setup.step_config.sims is None:
        return Batch(agent=agent_batch)
    sim = setup.sim or agent  # self-play: the agent's own model voices the simulator
    sims_batch = population_batch(setup.env, episodes, SIM, sim.tokenizer, advantages["sims"],
                                  config.sim.population, sim.sampling.pad_token_id)
    return Batch(agent=agent_batch, sims=sims_batch)


def make_batch(setup: Setup, config, episodes: list[Episode]) -> Batch:
    """The train step's batch: the agent's views [N, L], and the simulators' [P, M, L] when they train."""
    return views_batch(setup, config, episodes, role_advantages(setup, config, episodes))


def evaluate(setup: Setup, config, agent: Player, key: jax.Array, step: int) -> dict[str, float]:
    """Mean agent reward against each held-out simulator on the eval split (heldout/i is
    config.eval.sim_models[i])."""
    results = {}
    for i, sim in enumerate(setup.eval_sims):
        episodes = make_episodes(setup.env, config, step, "eval", config.train.eval_groups)
        rollout(setup.env, episodes, agent, members_turn([sim]), jax.random.fold_in(key, i))
        results[f"heldout/{i}"] = float(np.mean([e.rewards["agent"] for e in episodes]))
    results["heldout_reward"] = float(np.mean(list(results.values())))
    return results


def run_fingerprint(config: ml_collections.ConfigDict) -> str:
    """Fingerprint of everything that shapes the run's trajectory: all settings but the step budget, so a
    finished run can be extended with a larger train.steps."""
    settings = config.to_dict()
    settings["train"] = {k: v for k, v in settings["train"].items() if k != "steps"}
    return config_fingerprint(settings)


def train(config: ml_collections.ConfigDict, run_dir: RunDir) -> tuple[joint.JointState, dict[str, float]]:
    """Run (or resume) training into `run_dir`; returns the final state and the last logged metrics."""
    setup = build(config)
    state = setup.state
    mesh = setup.mesh
    ckpt = Checkpointer(run_dir.path / "checkpoints", run_fingerprint(config))
    start, skips = 0, 0
    if ckpt.latest_step() is not None:
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                state, joint.state_shardings(state, mesh))
        state, host = ckpt.restore(abstract)
        start, skips = host["step"], host["consecutive_skips"]
        run_dir.truncate_metrics(start)
        print(f"resumed from step {start}")
    else:
        state = jax.device_put(state, joint.state_shardings(state, mesh))
    probes = monitor.Monitor(setup.env, config.monitor, setup.agent, config.seed)
    step_fn = None
    metrics: dict[str, float] = {}
    for step in run_dir.progress(range(start, config.train.steps), desc="train",
                                 total=config.train.steps - start):
        t0 = time.perf_counter()
        players, key, episodes = rollout_step(setup, config, state, step)
        t1 = time.perf_counter()
        batch = make_batch(setup, config, episodes)
        t2 = time.perf_counter()
        if step_fn is None:
            step_fn = compile_train_step(setup.train_step, state, batch, mesh)
        # Evaluate and probe with the parameters the episodes were sampled with (the step donates them).
        extra = {}
        if config.train.eval_every and (step + 1) % config.train.eval_every == 0:
            extra.update(evaluate(setup, config, players.agent, jax.random.fold_in(key, 1), step))
            extra.update(probes.costly(players, jax.random.fold_in(key, 2)))
            firsts = episodes[::config.rollout.group_size]  # one episode per scenario
            write_samples(run_dir, setup.env, step, firsts[:config.train.samples])
        t3 = time.perf_counter()
        state, step_metrics = step_fn(state, batch)
        step_metrics = jax.device_get(step_metrics)
        t4 = time.perf_counter()
        tokens = int(batch.agent.loss_mask.sum()) + (int(batch.sims.loss_mask.sum()) if batch.sims else 0)
        metrics = {**episode_stats(episodes), **monitor.step_metrics(episodes, config.monitor.distinct_n),
                   **_flatten(step_metrics),
                   **extra, "time/rollout": t1 - t0, "time/batch": t2 - t1, "time/update": t4 - t3,
                   "time/step": t4 - t0 - (t3 - t2), "tokens_per_s": tokens / (t4 - t3)}
        if setup.verbalizer is not None:
            metrics.update({f"verbalized/{k}": v for k, v in setup.verbalizer.metrics().items()})
        skips = skips + 1 if step_metrics["skipped"] else 0
        run_dir.log(step, metrics)
        if skips > config.train.max_consecutive_skips:
            raise TrainingStopped(f"{skips} non-finite steps in a row at step {step}; the last good "
                                  f"checkpoint (step {ckpt.latest_step()}) is intact")
        if (step + 1) % config.train.checkpoint_every == 0 or step + 1 == config.train.steps:
            ckpt.save(step + 1, state, {"step": step + 1, "consecutive_skips": skips})
    ckpt.close()
    return state, metrics


def _flatten(metrics: dict[str, Any]) -> dict[str, float]:
    """Scalars as they are; per-member arrays [P] as their mean plus one entry per member."""
    flat = {}
    for key, value in metrics.items():
        value = np.asarray(value)
        if value.ndim == 0:
            flat[key] = float(value)
        else:
            flat[key] = float(value.mean())
            flat.update({f"{key}/{i}": float(v) for i, v in enumerate(value)})
    return flat
