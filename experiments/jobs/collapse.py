"""Job `collapse`: the simulator-collapse testbed (scope_jax.testbed) end to end.

Pretrains a tiny transformer agent and simulators on the persona game, makes the aligned simulators
mode-collapsed, trains the same agent with every arm on the same seeds, evaluates each snapshot exactly
on the population and on held-out simulators, and writes curves (metrics.jsonl, tensorboard), figures,
summary.md and summary.json. Rerun into the same --workdir, an interrupted run resumes: pretraining and
finished arms are loaded, not redone.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from scope_jax.algorithms import ADVANTAGES, GROUP_SIZE
from scope_jax.config import FINITE_AT_LEAST_0, FINITE_POSITIVE, ConfigError, at_least, one_of, require
from scope_jax.testbed import arms, data_report, experiment, report, scarce_report
from scope_jax.testbed.pretrain import PretrainConfig
from scope_jax.testbed.rl import RLConfig
from scope_jax.testbed.user_data import DataConfig
from scope_jax.training.run_dir import RunDir

DEFAULT_ARMS = ("untrained", "frozen", "frozen_base", "verbalized", "cotrain", "cotrain_base",
                "cotrain_base_anchor", "population", "rotation", "selfplay")


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "collapse"
    c.seeds = (0, 1, 2, 3, 4)
    c.heldout_seeds = (101, 102)
    c.arms = DEFAULT_ARMS
    c.vs_samples = 2
    c.workers = 2  # threads the arms run on (testbed.experiment.run); each arm's numbers do not depend on it
    c.pretrain_for = ()  # arms whose models pretraining also makes (the sweep: the default's)
    # Co-Training like for like at every (KL weight, simulator learning rate, objective) of the grid.
    c.sweep = ml_collections.ConfigDict({"kl_coefs": (), "sim_learning_rates": (),
                                         "objectives": ("adversarial",)})
    # User data: at every size N, the fitted, Verbalized Sampling fitted and data-anchored Co-Training arms
    # (one per weight in data_coefs); no sizes, no data arms.
    c.data = ml_collections.ConfigDict(dataclasses.asdict(DataConfig()) | {"sizes": ()})
    # Scarce user data: at every size N, the arms of `arms.scarce_arms` (fitted, calibrated, the fitted
    # population, regret + data from either) with the data anchor's weight data_coef; no sizes, no arms.
    c.scarce = ml_collections.ConfigDict({"sizes": (), "data_coef": 16.0})
    c.pretrain = ml_collections.ConfigDict(dataclasses.asdict(PretrainConfig()))
    c.rl = ml_collections.ConfigDict(dataclasses.asdict(RLConfig()))
    return c


def arm_list(config: ml_collections.ConfigDict) -> tuple[arms.Arm, ...]:
    sweep = config.sweep
    return tuple(arms.ARMS[a] for a in config.arms) + tuple(
        arms.sweep_arm(kl, lr, objective) for objective in sweep.objectives for kl in sweep.kl_coefs
        for lr in sweep.sim_learning_rates) + tuple(
        arm for n in config.data.sizes for arm in arms.data_arms(n, tuple(config.data.data_coefs))) + tuple(
        arm for n in config.scarce.sizes for arm in arms.scarce_arms(n, config.scarce.data_coef))


def data_config(config: ml_collections.ConfigDict) -> DataConfig | None:
    d = config.data.to_dict()
    d["sizes"] = tuple(sorted(set(d["sizes"]) | set(config.scarce.sizes)))
    if not d["sizes"]:
        return None
    return DataConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def settings(config: ml_collections.ConfigDict) -> experiment.Settings:
    pre = config.pretrain.to_dict()
    pre["heldout_priors"] = tuple(tuple(float(x) for x in p) for p in pre["heldout_priors"])
    return experiment.Settings(seeds=tuple(config.seeds), arms=arm_list(config),
                               pretrain=PretrainConfig(**pre), rl=RLConfig(**config.rl.to_dict()),
                               heldout_seeds=tuple(config.heldout_seeds), vs_samples=config.vs_samples,
                               workers=config.workers, data=data_config(config),
                               pretrain_for=tuple(arms.ARMS[a] for a in config.pretrain_for))


# A count of 0 (a step count, batch, size or interval) would break the run part-way, after pretraining.
COUNTS = ("workers", "vs_samples", "rl.steps", "rl.eval_every", "rl.groups",
          "rl.rotation_block", "rl.best_response_every", "pretrain.hidden_size", "pretrain.num_layers",
          "pretrain.batch", "pretrain.vs_batch", "pretrain.agent_steps", "pretrain.sim_steps",
          "pretrain.collapse_steps", "pretrain.selfplay_steps", "data.fit_steps", "data.fit_batch",
          "data.check_every", "data.vs_steps", "data.vs_batch")
RULES = {**{key: at_least(1) for key in COUNTS}, "rl.group_size": GROUP_SIZE,
         "rl.learning_rate": FINITE_AT_LEAST_0, "rl.sim_learning_rate": FINITE_AT_LEAST_0,
         "rl.sim_kl_coef": FINITE_AT_LEAST_0, "rl.advantage": one_of(ADVANTAGES),
         "pretrain.learning_rate": FINITE_AT_LEAST_0, "pretrain.collapse_temperature": FINITE_POSITIVE,
         "data.fit_learning_rate": FINITE_AT_LEAST_0}


def check(config: ml_collections.ConfigDict) -> None:
    require(config, RULES)  # first: the checks below divide by and count with these values
    for key in ("arms", "pretrain_for"):
        unknown = [a for a in config[key] if a not in arms.ARMS]
        if unknown:
            raise ConfigError(f"config key '{key}' holds unknown arms {unknown}; "
                              f"known: {', '.join(arms.ARMS)}")
    bad = [o for o in config.sweep.objectives if o not in arms.OBJECTIVES]
    if bad:
        raise ConfigError(f"config key 'sweep.objectives' holds {bad}; known: {', '.join(arms.OBJECTIVES)}")
    if any(x < 0 for x in tuple(config.sweep.kl_coefs) + tuple(config.sweep.sim_learning_rates)):
        raise ConfigError("config keys 'sweep.kl_coefs' and 'sweep.sim_learning_rates' must be >= 0")
    if any(n < 10 for n in config.data.sizes) or any(c <= 0 for c in config.data.data_coefs):
        raise ConfigError("config keys 'data.sizes' must be >= 10 dialogues and 'data.data_coefs' > 0")
    if any(n < 10 for n in config.scarce.sizes) or config.scarce.data_coef <= 0:
        raise ConfigError("config keys 'scarce.sizes' must be >= 10 dialogues and 'scarce.data_coef' > 0")
    if config.data.sizes and not config.data.data_coefs:
        raise ConfigError("config key 'data.data_coefs' needs at least one weight when 'data.sizes' is set")
    if config.rl.steps % config.rl.eval_every:
        raise ConfigError("config key 'rl.steps' must be a multiple of 'rl.eval_every'")
    members = max(arm.members for arm in arm_list(config))
    if config.rl.groups % members:
        raise ConfigError(f"config key 'rl.groups' must be a multiple of the largest population ({members})")
    if len(config.heldout_seeds) != len(config.pretrain.heldout_priors):
        raise ConfigError("config keys 'heldout_seeds' and 'pretrain.heldout_priors' "
                          "must have the same length")
    if len(config.seeds) < 2:
        raise ConfigError("config key 'seeds' needs at least 2 seeds for confidence intervals")


def run(config: ml_collections.ConfigDict, run_dir: RunDir) -> None:
    results = experiment.run(settings(config), run_dir)
    report.write(results, run_dir, [data_report.SECTION, scarce_report.SECTION])
