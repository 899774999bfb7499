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
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np

from scope_jax import diagnostics
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import Speakers, play, rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player, sample_replies
from scope_jax.dialogue.views import prompt_ids
from scope_jax.envs.base import Environment


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
    """Holds the fixed probe contexts (built once from the initial agent) and runs the costly estimates."""

    def __init__(self, env: Environment, config, initial_agent: Player, seed: int):
        self.env, self.config = env, config
        rng = np.random.default_rng([seed, 7])
        self.probes = self._to_fork_point(
            [Episode(s, group=i)
             for i, s in enumerate(env.sample_scenarios(config.probe_contexts, rng, "eval"))],
            {AGENT: ModelSpeaker(initial_agent)}, jax.random.key(seed))

    def _to_fork_point(self, episodes: list[Episode], speakers: Speakers, key: jax.Array) -> list[Episode]:
        """Play new episodes up to (not including) their first simulator turn."""
        return rollout(self.env, episodes, speakers, key, pause_before=SIM)

    def costly(self, speakers: Speakers, sim: Player, key: jax.Array) -> dict[str, float]:
        """The estimates with the current `speakers` and the simulator model `sim` that the probes ask."""
        probe_key, fork_key, branch_key = jax.random.split(key, 3)
        k = self.config.probe_samples
        prompts = [prompt_ids(sim.tokenizer, self.env.system_prompt(e.scenario, SIM), e.messages, SIM)
                   for e in self.probes if not e.done]
        greedy = sample_replies(sim, prompts, probe_key, dataclasses.replace(sim.sampling, temperature=0.0))
        resampled = sample_replies(sim, [p for p in prompts for _ in range(k)],
                                   jax.random.fold_in(probe_key, 1))
        deviation = diagnostics.simulator_deviation([g.ids for g in greedy],
                                                    [[s.ids for s in resampled[i * k:(i + 1) * k]]
                                                     for i in range(len(prompts))])

        rng = np.random.default_rng(np.asarray(jax.random.key_data(fork_key)).ravel().tolist())
        cfg = self.config
        scenarios = self.env.sample_scenarios(cfg.fork_contexts, rng, "train")
        forks = self._to_fork_point([Episode(s, group=i) for i, s in enumerate(scenarios)
                                     for _ in range(cfg.forks)], speakers, fork_key)
        branches = [copy.deepcopy(e) for e in forks for _ in range(cfg.branches)]
        play(self.env, branches, speakers, branch_key)
        returns = np.asarray([e.rewards["agent"] for e in branches]).reshape(cfg.fork_contexts, cfg.forks,
                                                                             cfg.branches)
        splits = [diagnostics.branching_variance_split(r) for r in returns]
        mean = lambda field: float(np.mean([getattr(split, field) for split in splits]))
        sim_side, agent_side = mean("simulator_side"), mean("agent_side")
        total = sim_side + agent_side
        return {"monitor/sim_deviation": deviation, "monitor/variance_sim_side": sim_side,
                "monitor/variance_agent_side": agent_side,
                "monitor/variance_sim_share": sim_side / total if total else float("nan")}
