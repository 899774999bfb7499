"""The host loop of multi-turn agent-simulator RL.

Each step: sample scenarios -> roll out groups of episodes (agent vs. simulators) -> rewards ->
group-relative advantages per role -> one jitted train step on the joint state -> log. Every
`eval_every` steps the agent plays held-out simulators; every `checkpoint_every` steps the whole state
is saved. Scenarios and rollout keys of step s are functions of (seed, s) only, so a run resumed from a
checkpoint repeats exactly the steps an uninterrupted run would have taken.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from scope_jax import envs, sharding
from scope_jax.dialogue.batching import group_advantages, pad_views, final_view, population_batch
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import Player, rollout
from scope_jax.sampling import SamplingConfig
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch
from scope_jax.training.checkpoint import Checkpointer, config_fingerprint
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train_step import TrainStepConfig, compile_train_step, make_train_step

log = logging.getLogger(__name__)

SIM_MODES = ("frozen", "cotrain", "population", "selfplay")


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


def default_config() -> ml_collections.ConfigDict:
    """Every setting of a dialogue RL run, with its default."""
    c = ml_collections.ConfigDict()
    c.experiment = "dialogue_rl"
    c.seed = 0
    c.env = ml_collections.ConfigDict({"name": "target_word", "max_turns": 2})
    c.agent = ml_collections.ConfigDict({"model": "tiny:0", "dtype": "float32", "max_context": 512})
    c.sim = ml_collections.ConfigDict({
        "mode": "frozen",          # frozen | cotrain | population | selfplay
        "model": "tiny:1",         # population members are "model" with seeds + 0..P-1 for tiny specs
        "population": 1,
        "objective": "shared",     # shared (the agent's reward) | adversarial (minus it)
        "assignment": "round_robin",  # round_robin | random (balanced)
    })
    c.sampling = ml_collections.ConfigDict({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8})
    c.rollout = ml_collections.ConfigDict({"groups": 4, "group_size": 4})
    c.algo = ml_collections.ConfigDict({
        "advantage": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "dual_clip": 0.0,
        "aggregation": "token_mean", "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0,
        "sim_kl_coef": 0.0,
    })
    c.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
    c.train = ml_collections.ConfigDict({
        "steps": 30, "microbatches": 1, "eval_every": 10, "eval_groups": 4, "checkpoint_every": 10,
        "max_consecutive_skips": 3,
    })
    c.eval = ml_collections.ConfigDict({"sim_models": ("tiny:101",)})
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    return c


def check(config: ml_collections.ConfigDict) -> None:
    from scope_jax.config import ConfigError

    if config.sim.mode not in SIM_MODES:
        raise ConfigError(f"config key 'sim.mode' is {config.sim.mode!r}; one of {', '.join(SIM_MODES)}")
    if config.sim.mode != "population" and config.sim.population != 1:
        raise ConfigError("config key 'sim.population' must be 1 unless sim.mode is 'population'")
    if config.sim.objective not in ("shared", "adversarial"):
        raise ConfigError(f"config key 'sim.objective' is {config.sim.objective!r}; one of shared, adversarial")
    episodes = config.rollout.groups * config.rollout.group_size
    if episodes % (config.sim.population * config.train.microbatches):
        raise ConfigError("config key 'rollout.groups' x 'rollout.group_size' must be a multiple of "
                          "sim.population x train.microbatches")


def _loss_config(algo, kl_coef: float) -> LossConfig:
    return LossConfig(epsilon_low=algo.epsilon_low, epsilon_high=algo.epsilon_high,
                      dual_clip=algo.dual_clip or None, aggregation=algo.aggregation, kl_coef=kl_coef,
                      kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef)


@dataclasses.dataclass
class Setup:
    """Everything built once from the config."""

    env: Any
    agent: Player
    sims: list[Player]
    eval_sims: list[Player]
    state: joint.JointState
    train_step: Any
    step_config: TrainStepConfig


def build(config: ml_collections.ConfigDict) -> Setup:
    env = envs.make(config.env.name, **{k: v for k, v in config.env.items() if k != "name"})
    words = getattr(env, "vocabulary", ())
    sampling = lambda tokenizer: SamplingConfig(
        temperature=config.sampling.temperature, top_k=config.sampling.top_k, top_p=config.sampling.top_p,
        max_new_tokens=config.sampling.max_new_tokens,
        stop_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id or 0)
    player = lambda spec: _player(load_model(spec, words=words, dtype=config.agent.dtype), sampling,
                                  config.agent.max_context)

    agent = player(config.agent.model)
    mode = config.sim.mode
    if mode == "selfplay":
        sims = [agent]
    else:
        sims = [player(_member_spec(config.sim.model, p)) for p in range(config.sim.population)]
    eval_sims = [player(spec) for spec in config.eval.sim_models]

    trains_sims = mode in ("cotrain", "population", "selfplay")
    params = {"agent": agent.params}
    if mode != "selfplay":
        params["sims"] = joint.stack_population([s.params for s in sims])
    roles = {role: (role == "agent" or trains_sims) for role in params}
    optimizer = make_optimizer(OptimizerConfig(**config.optimizer.to_dict()), roles)
    ref_roles = tuple(r for r, coef in (("agent", config.algo.kl_coef), ("sims", config.algo.sim_kl_coef)) if coef)
    if mode == "selfplay" and config.algo.sim_kl_coef:
        ref_roles = tuple(dict.fromkeys(ref_roles + ("agent",)))
    state = joint.create(params, optimizer, seed=config.seed, ref_roles=ref_roles)
    step_config = TrainStepConfig(
        agent=_loss_config(config.algo, config.algo.kl_coef),
        sims=_loss_config(config.algo, config.algo.sim_kl_coef) if trains_sims else None,
        self_play=mode == "selfplay", microbatches=config.train.microbatches)
    step = make_train_step(agent.graphdef, sims[0].graphdef, optimizer, step_config)
    return Setup(env, agent, sims, eval_sims, state, step, step_config)


def _player(model, sampling, max_context: int) -> Player:
    graphdef, params, tokenizer = model
    return Player(graphdef, params, tokenizer, sampling(tokenizer), max_context)


def _member_spec(spec: str, member: int) -> str:
    if spec.startswith("tiny:"):
        return f"tiny:{int(spec.split(':')[1]) + member}"
    return spec


def make_episodes(env, config, step: int, split: str, groups: int, population: int) -> list[Episode]:
    """Episodes of step `step`: `groups` scenarios x group_size rollouts, balanced over simulators."""
    rng = np.random.default_rng([config.seed, step, split == "eval"])
    scenarios = env.sample_scenarios(groups, rng, split=split)
    size = config.rollout.group_size
    if config.sim.assignment == "random":
        members = rng.permutation(np.arange(groups * size) % population)
    else:
        members = np.arange(groups * size) % population
    return [Episode(scenarios[g], group=g, sim_index=int(members[g * size + k]))
            for g in range(groups) for k in range(size)]


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    rewards = np.asarray([e.rewards["agent"] for e in episodes])
    stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std()),
             "turns": float(np.mean([len(e.messages) for e in episodes]))}
    for reason in sorted({e.end_reason for e in episodes}):
        stats[f"end/{reason}"] = float(np.mean([e.end_reason == reason for e in episodes]))
    return stats


def make_batch(setup: Setup, config, episodes: list[Episode]) -> tuple[Batch, dict[str, float]]:
    env, agent = setup.env, setup.agent
    rewards = np.asarray([e.rewards["agent"] for e in episodes], np.float32)
    groups = np.asarray([e.group for e in episodes])
    agent_adv = group_advantages(rewards, groups, config.algo.advantage)
    views = [final_view(env, e, AGENT, agent.tokenizer) for e in episodes]
    agent_batch = pad_views(views, agent_adv, agent.sampling.pad_token_id)
    stats = {"zero_variance_groups": float(np.mean([np.ptp(rewards[groups == g]) == 0 for g in np.unique(groups)]))}
    sims_batch = None
    if setup.step_config.sims is not None:
        sim_rewards = np.asarray([e.rewards["sim"] if config.sim.objective == "shared" else -e.rewards["agent"]
                                  for e in episodes], np.float32)
        population = len(setup.sims)
        sim_groups = groups * population + np.asarray([e.sim_index for e in episodes])
        sim_adv = group_advantages(sim_rewards, sim_groups, config.algo.advantage)
        sims_batch = population_batch(env, episodes, SIM, setup.sims[0].tokenizer, sim_adv, population,
                                      setup.sims[0].sampling.pad_token_id)
    return Batch(agent=agent_batch, sims=sims_batch), stats


def current_players(setup: Setup, state: joint.JointState) -> tuple[Player, list[Player]]:
    agent = dataclasses.replace(setup.agent, params=state.params["agent"])
    if "sims" not in state.params:
        return agent, [agent]
    sims = [dataclasses.replace(s, params=jax.tree.map(lambda x: x[p], state.params["sims"]))
            for p, s in enumerate(setup.sims)]
    return agent, sims


def evaluate(setup: Setup, config, state: joint.JointState, step: int) -> dict[str, float]:
    """Mean agent reward against each held-out simulator on the eval split."""
    agent, _ = current_players(setup, state)
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 1_000_000 + step)
    results = {}
    for i, sim in enumerate(setup.eval_sims):  # heldout/i is config.eval.sim_models[i]
        episodes = make_episodes(setup.env, config, step, "eval", config.train.eval_groups, 1)
        rollout(setup.env, episodes, agent, [sim], jax.random.fold_in(key, i))
        results[f"heldout/{i}"] = float(np.mean([e.rewards["agent"] for e in episodes]))
    results["heldout_reward"] = float(np.mean(list(results.values())))
    return results


def train(config: ml_collections.ConfigDict, run_dir: RunDir) -> dict[str, float]:
    """Run (or resume) training into `run_dir`; returns the last logged metrics."""
    setup = build(config)
    state = setup.state
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
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
    step_fn = None
    metrics: dict[str, float] = {}
    for step in run_dir.progress(range(start, config.train.steps), desc="train",
                                 total=config.train.steps - start):
        t0 = time.perf_counter()
        agent, sims = current_players(setup, state)
        episodes = make_episodes(setup.env, config, step, "train", config.rollout.groups, len(setup.sims))
        rollout(setup.env, episodes, agent, sims, jax.random.fold_in(jax.random.wrap_key_data(state.rng), step))
        t1 = time.perf_counter()
        batch, batch_stats = make_batch(setup, config, episodes)
        t2 = time.perf_counter()
        if step_fn is None:
            step_fn = compile_train_step(setup.train_step, state, batch, mesh)
        state, step_metrics = step_fn(state, batch)
        step_metrics = jax.device_get(step_metrics)
        t3 = time.perf_counter()
        tokens = int(batch.agent.loss_mask.sum()) + (int(batch.sims.loss_mask.sum()) if batch.sims else 0)
        metrics = {**episode_stats(episodes), **batch_stats, **_flatten(step_metrics),
                   "time/rollout": t1 - t0, "time/batch": t2 - t1, "time/update": t3 - t2,
                   "time/step": t3 - t0, "tokens_per_s": tokens / (t3 - t0)}
        skips = skips + 1 if step_metrics["skipped"] else 0
        if skips > config.train.max_consecutive_skips:
            run_dir.log(step, metrics)
            raise TrainingStopped(f"{skips} non-finite steps in a row at step {step}; the last good "
                                  f"checkpoint (step {ckpt.latest_step()}) is intact")
        if config.train.eval_every and (step + 1) % config.train.eval_every == 0:
            metrics.update(evaluate(setup, config, state, step))
        run_dir.log(step, metrics)
        if (step + 1) % config.train.checkpoint_every == 0 or step + 1 == config.train.steps:
            ckpt.save(step + 1, state, {"step": step + 1, "consecutive_skips": skips})
    ckpt.close()
    return metrics


def run_fingerprint(config: ml_collections.ConfigDict) -> str:
    """Fingerprint of everything that shapes the run's trajectory: all settings but the step budget, so a
    finished run can be extended with a larger train.steps."""
    settings = config.to_dict()
    settings["train"] = {k: v for k, v in settings["train"].items() if k != "steps"}
    return config_fingerprint(settings)


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
