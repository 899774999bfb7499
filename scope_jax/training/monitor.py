"""The collapse monitor in the training loop: what the theory talks about, measured every step.

Cheap, every step (`step_metrics`): fraction of zero-variance reward groups, within-group distinct-n
and share of identical agent replies, and each role's token entropy estimated from its sampled tokens
(-mean log-prob). (The Verbalized Sampling records, with the stated deviation 1 - p_max, are logged as
verbalized/* by the step.)

Costly, every `train.eval_every` steps (`Monitor.costly`):
  simulator deviation   on a fixed probe set of contexts (built once from the initial agent), the
                        simulator's greedy reply is compared with `probe_samples` resampled replies:
                        1 - frequency of the greedy reply (scope_jax.diagnostics.simulator_deviation)
  variance split        for each of `fork_contexts` scenarios, `forks` fresh episodes are played up to
                        their first simulator turn, copied `branches` times, and each copy is finished
                        independently; within a scenario the return variance splits into the part after
                        the fork (the simulator's reply and everything after it) and the agent's part
                        before it (Lemma 3.3; scope_jax.diagnostics.branching_variance_split), averaged
                        over scenarios. Single steps are noisy: the agent side may come out negative.

Probe contexts and fork scenarios are cut into the run's shards (`scope_jax.distributed.Shards`): each
process plays its shards' part, and the estimates are computed over every process's results.
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np

from scope_jax import diagnostics, distributed
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import Speakers, play, rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player, sample_replies
from scope_jax.dialogue.views import prompt_ids


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """probe_contexts / probe_samples: simulator deviation probes and resamples per probe.
    forks / branches: episodes forked at their first simulator turn and branches per fork (>= 2).
    distinct_n: n of the within-group distinct-n of agent replies."""

    probe_contexts: int = 8
    probe_samples: int = 8
    fork_contexts: int = 2
    forks: int = 4
    branches: int = 4
    distinct_n: int = 2


def agent_replies(episode: Episode) -> tuple[int, ...]:
    """Everything the agent sampled in an episode, as one token sequence."""
    return tuple(t for m in episode.messages if m.role == AGENT and m.sampled_ids for t in m.sampled_ids)


def sampled_entropy(episodes: list[Episode], role: str) -> float:
    logprobs = [lp for e in episodes for m in e.messages if m.role == role and m.logprobs
                for lp in m.logprobs]
    return (diagnostics.sampled_entropy(np.asarray(logprobs), np.ones(len(logprobs))) if logprobs
            else float("nan"))


def step_metrics(episodes: list[Episode], distinct_n: int = 2) -> dict[str, float]:
    rewards = np.asarray([e.rewards["agent"] for e in episodes])
    groups = np.asarray([e.group for e in episodes])
    replies = [agent_replies(e) for e in episodes]
    metrics = {
        "monitor/zero_variance_groups": diagnostics.zero_variance_fraction(rewards, groups),
        "monitor/agent_distinct_n": diagnostics.grouped(lambda r: diagnostics.distinct_n(r, distinct_n),
                                                        replies, groups),
        "monitor/agent_identical": diagnostics.grouped(diagnostics.identical_fraction, replies, groups),
        "monitor/agent_sampled_entropy": sampled_entropy(episodes, AGENT),
        "monitor/sim_sampled_entropy": sampled_entropy(episodes, SIM),
    }
    return metrics


class Monitor:
    """Holds this process's fixed probe contexts (built once from the initial agent, per shard) and runs
    the costly estimates."""

    def __init__(self, env: Environment, config, initial_agent: Player, seed: int,
                 shards: distributed.Shards | None = None):
        self.env, self.config = env, config
        self.shards = shards or distributed.Shards(1)
        rng = np.random.default_rng([seed, 7])
        probes = [Episode(s, group=i) for i, s in enumerate(env.sample_scenarios(config.probe_contexts, rng,
                                                                                 "eval"))]
        to_fork = lambda part, key: [self._to_fork_point(part, {AGENT: ModelSpeaker(initial_agent)}, key)]
        self.probes = self.shards.run(probes, jax.random.key(seed), to_fork)  # one list per shard of mine

    def _to_fork_point(self, episodes: list[Episode], speakers: Speakers, key: jax.Array) -> list[Episode]:
        """Play new episodes up to (not including) their first simulator turn."""
        return rollout(self.env, episodes, speakers, key, pause_before=SIM)

    def costly(self, speakers: Speakers, sim: Player, key: jax.Array) -> dict[str, float]:
        """The estimates with the current `speakers` and the simulator model `sim` that the probes ask."""
        probe_key, fork_key = jax.random.split(key)
        mine = [self._probe(probes, sim, jax.random.fold_in(probe_key, shard))
                for shard, probes in zip(self.shards.mine(), self.probes)]
        pairs = [pair for part in distributed.concatenated(mine) for pair in part]
        deviation = diagnostics.simulator_deviation([g for g, _ in pairs], [r for _, r in pairs])

        rng = np.random.default_rng(np.asarray(jax.random.key_data(fork_key)).ravel().tolist())
        cfg = self.config
        scenarios = self.env.sample_scenarios(cfg.fork_contexts, rng, "train")
        forks = [Episode(s, group=i) for i, s in enumerate(scenarios) for _ in range(cfg.forks)]
        returns = distributed.concatenated(self.shards.run(forks, fork_key,
                                                           lambda part, k: self._branch(part, speakers, k)))
        splits = [diagnostics.branching_variance_split(r) for r in returns]
        mean = lambda field: float(np.mean([getattr(split, field) for split in splits]))
        sim_side, agent_side = mean("simulator_side"), mean("agent_side")
        total = sim_side + agent_side
        return {"monitor/sim_deviation": deviation, "monitor/variance_sim_side": sim_side,
                "monitor/variance_agent_side": agent_side,
                "monitor/variance_sim_share": sim_side / total if total else float("nan")}

    def _probe(self, probes: list[Episode], sim: Player, key: jax.Array) -> list[tuple[tuple, list[tuple]]]:
        """(greedy reply, `probe_samples` resampled replies) of `sim` at each probe still going."""
        k = self.config.probe_samples
        prompts = [prompt_ids(sim.tokenizer, self.env.system_prompt(e.scenario, SIM), e.messages, SIM)
                   for e in probes if not e.done]
        if not prompts:
            return []
        greedy = sample_replies(sim, prompts, key, dataclasses.replace(sim.sampling, temperature=0.0))
        resampled = sample_replies(sim, [p for p in prompts for _ in range(k)], jax.random.fold_in(key, 1))
        return [(tuple(g.ids), [tuple(s.ids) for s in resampled[i * k:(i + 1) * k]])
                for i, g in enumerate(greedy)]

    def _branch(self, forks: list[Episode], speakers: Speakers, key: jax.Array) -> list[np.ndarray]:
        """Returns [forks, branches] of each scenario of `forks` (its `forks` episodes in a row), played to
        their fork point and each copy finished independently."""
        cfg = self.config
        fork_key, branch_key = jax.random.split(key)
        forks = self._to_fork_point(forks, speakers, fork_key)
        branches = [copy.deepcopy(e) for e in forks for _ in range(cfg.branches)]
        play(self.env, branches, speakers, branch_key)
        returns = np.asarray([e.rewards["agent"] for e in branches])
        return list(returns.reshape(-1, cfg.forks, cfg.branches))
