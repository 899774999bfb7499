"""Job `collapse`: the simulator-collapse testbed (scope_jax.testbed) end to end.

Pretrains a tiny transformer agent and simulators on the persona game, makes the aligned simulator
mode-collapsed, trains the same agent with every arm on the same seeds, evaluates each snapshot exactly
on the population and on held-out simulators, and writes curves (metrics.jsonl, tensorboard), figures,
summary.md and summary.json.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from scope_jax.config import ConfigError
from scope_jax.testbed import arms, experiment, report
from scope_jax.testbed.pretrain import PretrainConfig
from scope_jax.testbed.rl import RLConfig
from scope_jax.training.run_dir import RunDir


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "collapse"
    c.seeds = (0, 1, 2)
    c.heldout_seeds = (101, 102)
    c.arms = ("untrained", "frozen", "verbalized", "cotrain", "population")
    c.pretrain = ml_collections.ConfigDict(dataclasses.asdict(PretrainConfig()))
    c.rl = ml_collections.ConfigDict(dataclasses.asdict(RLConfig()))
    return c


def settings(config: ml_collections.ConfigDict) -> experiment.Settings:
    pre = config.pretrain.to_dict()
    pre["heldout_priors"] = tuple(tuple(float(x) for x in p) for p in pre["heldout_priors"])
    return experiment.Settings(seeds=tuple(config.seeds), arms=tuple(config.arms),
                               pretrain=PretrainConfig(**pre), rl=RLConfig(**config.rl.to_dict()),
                               heldout_seeds=tuple(config.heldout_seeds))


def check(config: ml_collections.ConfigDict) -> None:
    unknown = [a for a in config.arms if a not in arms.ARMS]
    if unknown:
        raise ConfigError(f"config key 'arms' holds unknown arms {unknown}; known: {', '.join(arms.ARMS)}")
    if config.rl.steps % config.rl.eval_every:
        raise ConfigError("config key 'rl.steps' must be a multiple of 'rl.eval_every'")
    members = max(arms.ARMS[a].members for a in config.arms)
    if config.rl.groups % members:
        raise ConfigError(f"config key 'rl.groups' must be a multiple of the largest population ({members})")
    if len(config.heldout_seeds) != len(config.pretrain.heldout_priors):
        raise ConfigError("config keys 'heldout_seeds' and 'pretrain.heldout_priors' "
                          "must have the same length")
    if len(config.seeds) < 2:
        raise ConfigError("config key 'seeds' needs at least 2 seeds for confidence intervals")


def run(config: ml_collections.ConfigDict, run_dir: RunDir) -> None:
    log = lambda arm, step, metrics: run_dir.log(step, metrics, prefix=f"{arm}/")
    results = experiment.run(settings(config), run_dir.path, log)
    report.write(results, run_dir)
