"""One step of multi-turn agent-simulator RL: rollout -> rewards -> advantages -> batch -> update.

    state, metrics, episodes = rl_step(setup, state, step)

The step's scenarios and rollout keys are functions of (seed, step) and the state's key only, so a run
resumed from a checkpoint repeats exactly the steps an uninterrupted run would have taken. What the
simulator side does is the mode's (`setup.mode`): who voices each episode, how the simulator answers,
and whether its turns enter the update.

The step's groups are played as `rollout.shards` rollouts (shard s with the key fold_in(key, s)), which the
processes of a multi-process job share (`scope_jax.distributed`): each plays its shards, its rows join
the global batch, and the step's statistics are computed over every process's episodes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import distributed
from scope_jax.algorithms import ADVANTAGES
from scope_jax.dialogue.episode import AGENT, ROLES, SIM, Episode
from scope_jax.dialogue.rollout import Speakers, rollout
from scope_jax.dialogue.speakers import ModelSpeaker, cache_stats
from scope_jax.dialogue.views import RoleView
from scope_jax.kv_cache import CacheStats
from scope_jax.simulators import verbalized
from scope_jax.simulators.modes import objective as sim_objective
from scope_jax.training import monitor
from scope_jax.training.batch import Batch, padded_length, role_batch
from scope_jax.training.setup import Setup
from scope_jax.training.state import JointState


def rl_step(setup: Setup, state: JointState, step: int) -> tuple[JointState, dict[str, float], list[Episode]]:
    """Train step `step`: play its episodes with the state's players, and update the state on them."""
    start = time.perf_counter()
    roles = speakers(setup, state.params)
    mine = play_episodes(setup, state, step, roles)
    played = time.perf_counter()
    batch = make_batch(setup, mine, role_advantages(setup, mine), step)
    episodes = distributed.concatenated(mine)
    batched = time.perf_counter()
    state, update = setup.update(state, batch)
    update = jax.device_get(update)
    done = time.perf_counter()
    tokens = sum(float(b.loss_mask.sum()) for b in (batch.agent, batch.sims) if b is not None)
    metrics = {**episode_stats(episodes), **monitor.step_metrics(episodes, setup.config.monitor.distinct_n),
               **cache_metrics(roles), **_flatten(update), "time/rollout": played - start,
               "time/batch": batched - played, "time/update": done - batched, "time/step": done - start,
               "tokens_per_s": tokens / (done - batched)}
    return state, metrics, episodes


def play_episodes(setup: Setup, state: JointState, step: int,
                  roles: Speakers | None = None) -> list[Episode]:
    """This process's episodes of train step `step` (all of them in a 1-process run), played to the end
    (rewards filled in) by `roles` (default: the state's players)."""
    episodes = make_episodes(setup, step, "train", setup.config.rollout.groups)
    return play_shards(setup, episodes, roles or speakers(setup, state.params), rollout_key(state, step))


def play_shards(setup: Setup, episodes: list[Episode], roles: Speakers, key: jax.Array) -> list[Episode]:
    """This process's shards of `episodes` (whole groups each), each played as one rollout; returns them."""
    return shards(setup).run(episodes, key, lambda part, k: rollout(setup.env, part, roles, k))


def shards(setup: Setup) -> distributed.Shards:
    return distributed.Shards(setup.config.rollout.shards)


def rollout_key(state: JointState, step: int) -> jax.Array:
    """The step's key, on this process (the state's key sits on the global mesh)."""
    return jax.random.fold_in(jax.random.wrap_key_data(jax.device_get(state.rng)), step)


def make_episodes(setup: Setup, step: int, split: str, groups: int) -> list[Episode]:
    """Episodes of step `step`: `groups` scenarios of `split` x group_size rollouts; in training the mode
    assigns each rollout's simulator (episode.sim_index), in evaluation there is one simulator."""
    config = setup.config
    rng = np.random.default_rng([config.seed, step, split == "eval"])
    scenarios = setup.env.sample_scenarios(groups, rng, split=split)
    size = config.rollout.group_size
    simulators = setup.mode.assign(step, size) if split == "train" else np.zeros(size, int)
    return [Episode(scenarios[g], group=g, sim_index=int(simulators[k])) for g in range(groups)
            for k in range(size)]


def speakers(setup: Setup, params: dict[str, Any]) -> Speakers:
    """Who speaks each role with the parameters `params` (a joint state's)."""
    params = setup.rollout_params(params)
    agent = dataclasses.replace(setup.agent, params=params["agent"])
    return {AGENT: ModelSpeaker(agent), SIM: setup.mode.speaker(setup.sims, params)}


def cache_metrics(roles: Speakers) -> dict[str, float]:
    """What the speakers' KV caches did in the step's rollout, summed over the roles and the processes:
    views that were not extensions of their cache (re-prefilled), tokens prefilled, tokens reused from a
    cache or a shared prefix, and shared-prefix tokens (each prefilled once per group)."""
    stats = sum(distributed.gather(sum(map(cache_stats, roles.values()), CacheStats())), CacheStats())
    return {"rollout/cache_fallbacks": stats.fallbacks, "rollout/prefill_tokens": stats.prefilled,
            "rollout/reused_tokens": stats.reused, "rollout/shared_prefix_tokens": stats.shared}


def group_advantages(rewards: np.ndarray, groups: np.ndarray, estimator: str) -> np.ndarray:
    """Advantages [N] of rewards [N] within groups (rollouts that share a scenario), by name."""
    _, dense = np.unique(groups, return_inverse=True)
    return np.asarray(ADVANTAGES[estimator](jnp.asarray(rewards, jnp.float32), jnp.asarray(dense),
                                            num_groups=int(dense.max()) + 1))


def role_advantages(setup: Setup, episodes: list[Episode]) -> dict[str, np.ndarray]:
    """Group-relative advantages [N] of each role that trains: "agent" (groups: the scenarios) and "sims"
    when the simulator role trains (groups: scenario x simulator; rewards: the sim.objective)."""
    estimator = setup.config.algo.advantage
    groups = np.asarray([e.group for e in episodes])
    rewards = np.asarray([e.rewards["agent"] for e in episodes], np.float32)
    advantages = {"agent": group_advantages(rewards, groups, estimator)}
    if setup.mode.sim_trains:
        objective = sim_objective(setup.config.sim.objective)
        sim_rewards = np.asarray([objective(e.rewards) for e in episodes], np.float32)
        sim_groups = groups * setup.mode.members + np.asarray([e.sim_index for e in episodes])
        advantages["sims"] = group_advantages(sim_rewards, sim_groups, estimator)
    return advantages


def make_batch(setup: Setup, episodes: list[Episode], advantages: dict[str, np.ndarray], step: int) -> Batch:
    """The train step's global batch on the mesh from each trained role's grown views of this process's
    `episodes` (its rows at its block; every process pads to the same length): the agent's [N, L], the
    simulators' [P, M, L] (episode e in slice e.sim_index) when the simulator role trains, and the data
    anchor's rows of train step `step` [P, M, L] when it has one."""
    views = lambda role, order: [episodes[i].views.get(role) or RoleView() for i in order]
    length = lambda views: distributed.agreed_max(padded_length(views))
    everyone = views(AGENT, range(len(episodes)))
    agent = role_batch(everyone, advantages["agent"], setup.agent.sampling.pad_token_id, length(everyone))
    if not setup.mode.sim_trains:
        return Batch(agent=distributed.global_rows(agent, setup.mesh))
    members = setup.mode.members
    indices = np.asarray([e.sim_index for e in episodes])
    counts = np.bincount(indices, minlength=members)
    if len(set(counts.tolist())) != 1:
        raise ValueError(f"simulator assignment is unbalanced ({counts.tolist()} episodes per member)")
    order = np.argsort(indices, kind="stable")
    sim = setup.mode.sim_player(setup.sims)
    sim_views = views(SIM, order)
    sims = role_batch(sim_views, advantages["sims"][order], sim.sampling.pad_token_id, length(sim_views),
                      members=members)
    data = None if setup.anchor is None else setup.anchor.rows(step, members, int(counts[0]))
    return Batch(agent=distributed.global_rows(agent, setup.mesh),
                 sims=distributed.global_rows(sims, setup.mesh, axis=1),
                 sim_data=None if data is None else distributed.global_rows(data, setup.mesh, axis=1))


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    """Reward, length and end reasons of a step's episodes, the environment's other outcomes (env/KEY:
    the mean over the episodes where it is defined, not NaN), and the Verbalized Sampling records."""
    rewards = np.asarray([e.rewards["agent"] for e in episodes])
    stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std()),
             "messages": float(np.mean([len(e.messages) for e in episodes]))}
    for reason in sorted({e.end_reason for e in episodes}):
        stats[f"end/{reason}"] = float(np.mean([e.end_reason == reason for e in episodes]))
    for key in sorted(set(episodes[0].rewards) - set(ROLES)):  # the environment's other outcomes
        values = np.asarray([e.rewards[key] for e in episodes], np.float64)
        defined = values[~np.isnan(values)]
        stats[f"env/{key}"] = float(defined.mean()) if defined.size else float("nan")
    records = [r for e in episodes for r in e.info.get("verbalized", [])]
    if records:
        stats.update({f"verbalized/{k}": v for k, v in verbalized.summarize(records).items()})
    return stats


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
