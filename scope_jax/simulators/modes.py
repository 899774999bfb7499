"""Simulator modes: for each `sim.mode`, how the simulator side answers and which parameters train.

A mode is one class below; the training loop looks it up in `MODES` and asks it, never branching on its
name. What the loop asks:

  reads              which of sim.model / sim.models / sim.population the mode takes (a key it does not
                     read must keep its unset value, so nothing set is silently ignored)
  member_specs       the models stacked into the joint state's params["sims"] ([P, ...]); none: no "sims"
  listed_specs       frozen models kept outside the joint state (any architecture or tokenizer)
  trained            the parameter groups of the joint state that train
  sim_params         the parameter group whose simulator turns enter the loss (None: the simulator role
                     does not train, `sim_trains` is false; "agent" in self-play)
  members            P: how many simulators the simulator batch and its advantage groups split into
  assign             which simulator voices each rollout of a scenario group (episode.sim_index)
  speaker            the simulator side's speaker with the current parameters
  probe              the one simulator model whose own replies the collapse monitor probes

The modes:

  frozen      one simulator model, never updated; trains: the agent
  verbalized  the same, answering by Verbalized Sampling; trains: the agent
  cotrain     one simulator trained on the same episodes (its own turns and advantages, the KL anchor
              algo.sim_kl_coef); trains: the agent and the simulator
  population  P simulators of one architecture (members "tiny:SEED+p" of a tiny spec, else P copies),
              stacked, each voicing group_size / P rollouts of every scenario; generation and loss
              vmapped over P; trains: the agent and every member
  rotation    several frozen models (sim.models) taken in turn, one per step: step s voices every episode
              with model s mod n; trains: the agent
  mixture     the same models within each step: rollout k of every scenario voiced by model k mod n;
              trains: the agent
  selfplay    one set of weights plays both roles (params has no "sims"); trains: the agent, on its agent
              and its simulator turns

A trained simulator's reward is its objective (`OBJECTIVES`, key sim.objective): "adversarial" (the
default: minus the agent's reward, kept near its start by the KL anchor) or "cooperative" (the
environment's simulator reward, e.g. target word's shared reward, P4G's donation). "regret" (the
best response's value minus the agent's) needs the best response to the simulator, which only the
collapse testbed computes (exactly, on its tabulated simulator); here it is refused (`objective`). The
data anchor composes with any objective: `sim.data_coef` x the NLL of user dialogues in the
simulator's loss (`LossConfig.data_coef`), which needs user data (`sim.data`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import numpy as np

from scope_jax.config import ConfigError
from scope_jax.dialogue.speakers import MembersSpeaker, ModelSpeaker, Player, PopulationSpeaker, Speaker
from scope_jax.models.decoder import population_member
from scope_jax.simulators.verbalized import VerbalizedSampler, verbalized_config
from scope_jax.simulators.verbalized_speaker import VerbalizedSpeaker

# sim.KEY -> its unset value: a mode that does not read the key requires it
SIM_KEYS = {"model": "", "models": (), "population": 1}
OBJECTIVES: dict[str, Callable[[dict[str, float]], float]] = {
    "adversarial": lambda rewards: -rewards["agent"],
    "cooperative": lambda rewards: rewards["sim"],
}
# Objectives defined elsewhere that the dialogue loop cannot compute, and why.
UNAVAILABLE_OBJECTIVES = {
    "regret": "needs the best response to the simulator (its value minus the agent's), which the dialogue "
              "loop does not have; the collapse testbed computes it exactly (scope_jax/testbed)",
}


def objective(name: str) -> Callable[[dict[str, float]], float]:
    """The reward of a trained simulator under objective `name` (ConfigError, one line, otherwise)."""
    if name in UNAVAILABLE_OBJECTIVES:
        raise ConfigError(f"config key 'sim.objective' is {name!r}: it {UNAVAILABLE_OBJECTIVES[name]}")
    if name not in OBJECTIVES:
        raise ConfigError(f"config key 'sim.objective' is {name!r}; one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


@dataclasses.dataclass(frozen=True)
class SimulatorModels:
    """The models a mode's simulator side is made of, loaded by the training setup from the mode's specs.

    agent: the agent's player; members: the `member_specs` models with params stacked [P, ...] (None
    when there are none); listed: the `listed_specs` models. Players hold their initial parameters;
    `speaker` and `probe` take the current ones from the joint state's params.
    """

    agent: Player
    members: Player | None
    listed: tuple[Player, ...]


def _with(player: Player, params: Any) -> Player:
    return dataclasses.replace(player, params=params)


def first_member(population: Player) -> Player:
    """Member 0 of a population player (params stacked [P, ...])."""
    return _with(population, population_member(population.params, 0))


def member_spec(spec: str, member: int) -> str:
    """Population member p of a model spec: "tiny:SEED+p" for a tiny spec, else the same model (a
    "BASE+ADAPTER" spec too: a LoRA population shares one base)."""
    tiny = spec.startswith("tiny:") and "+" not in spec
    return f"tiny:{int(spec.split(':')[1]) + member}" if tiny else spec


class SimulatorMode:
    """What the loop asks of a mode (see the module docstring), answered here for one frozen simulator
    model in params["sims"] (P = 1); each mode below overrides what differs."""

    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]] = ("model",)
    trained: ClassVar[tuple[str, ...]] = ("agent",)
    sim_params: ClassVar[str | None] = None

    def __init__(self, config):
        self.config = config

    def check(self) -> None:
        """Contracts of the mode beyond the keys it reads (ConfigError naming the key)."""

    @property
    def sim_trains(self) -> bool:
        """Whether the simulator role's turns enter the update."""
        return self.sim_params is not None

    @property
    def members(self) -> int:
        return 1

    def member_specs(self) -> list[str]:
        return [member_spec(self.config.sim.model, p) for p in range(self.members)]

    def listed_specs(self) -> list[str]:
        return []

    def assign(self, step: int, group_size: int) -> np.ndarray:
        return np.arange(group_size) % self.members

    def speaker(self, models: SimulatorModels, params: dict[str, Any]) -> Speaker:
        return PopulationSpeaker(_with(models.members, params["sims"]), self.members)

    def probe(self, models: SimulatorModels, params: dict[str, Any]) -> Player:
        return first_member(_with(models.members, params["sims"]))

    def sim_player(self, models: SimulatorModels) -> Player:
        """The player whose model voices a trained simulator role (its tokenizer built the views)."""
        return models.members


class Frozen(SimulatorMode):
    """One simulator model in params["sims"] (P = 1), never updated."""

    name = "frozen"


class Verbalized(SimulatorMode):
    """The frozen simulator answering by Verbalized Sampling (config group `verbalized`)."""

    name = "verbalized"

    def __init__(self, config):
        super().__init__(config)
        self.sampler = VerbalizedSampler(verbalized_config(config.verbalized))

    def speaker(self, models: SimulatorModels, params: dict[str, Any]) -> Speaker:
        budget = self.config.verbalized.max_new_tokens
        return VerbalizedSpeaker(self.probe(models, params), self.sampler, budget)


class CoTrain(SimulatorMode):
    """One simulator trained on the same episodes as the agent, on its own turns and advantages."""

    name = "cotrain"
    trained = ("agent", "sims")
    sim_params = "sims"


class Population(CoTrain):
    """P trained simulators of one architecture, stacked; member p voices rollouts k = p mod P."""

    name = "population"
    reads = ("model", "population")

    @property
    def members(self) -> int:
        return self.config.sim.population

    def check(self) -> None:
        population, size = self.config.sim.population, self.config.rollout.group_size
        if population < 2:
            raise ConfigError(f"config key 'sim.population' is {population}; mode population needs at "
                              "least 2")
        if size % population or size // population < 2:
            raise ConfigError(f"config key 'rollout.group_size' is {size}; with sim.population {population} "
                              "it must give every member at least 2 rollouts of each scenario (a multiple of "
                              f"{population}, at least {2 * population}), or the simulators' group "
                              "advantages are all 0")


class Rotation(SimulatorMode):
    """Frozen models outside the joint state, one per step in turn."""

    name = "rotation"
    reads = ("models",)

    @property
    def members(self) -> int:
        return len(self.config.sim.models)

    def check(self) -> None:
        if len(self.config.sim.models) < 2:
            raise ConfigError(f"config key 'sim.models' lists {len(self.config.sim.models)} model(s); mode "
                              f"{self.name} takes at least 2")

    def member_specs(self) -> list[str]:
        return []

    def listed_specs(self) -> list[str]:
        return list(self.config.sim.models)

    def assign(self, step: int, group_size: int) -> np.ndarray:
        return np.full(group_size, step % self.members)

    def speaker(self, models: SimulatorModels, params: dict[str, Any]) -> Speaker:
        return MembersSpeaker(tuple(ModelSpeaker(player) for player in models.listed))

    def probe(self, models: SimulatorModels, params: dict[str, Any]) -> Player:
        return models.listed[0]


class Mixture(Rotation):
    """The rotation's models within every step: rollout k of each scenario voiced by model k mod n."""

    name = "mixture"

    def assign(self, step: int, group_size: int) -> np.ndarray:
        return np.arange(group_size) % self.members


class SelfPlay(SimulatorMode):
    """The agent's weights voice the simulator too, and learn from both roles' turns."""

    name = "selfplay"
    reads = ()
    sim_params = "agent"

    def member_specs(self) -> list[str]:
        return []

    def speaker(self, models: SimulatorModels, params: dict[str, Any]) -> Speaker:
        return ModelSpeaker(self.probe(models, params))

    def probe(self, models: SimulatorModels, params: dict[str, Any]) -> Player:
        return _with(models.agent, params["agent"])

    def sim_player(self, models: SimulatorModels) -> Player:
        return models.agent


MODES: dict[str, type[SimulatorMode]] = {
    mode.name: mode for mode in (Frozen, Verbalized, CoTrain, Population, Rotation, Mixture, SelfPlay)}


def sim_settings(mode: str, **values: Any) -> dict[str, Any]:
    """sim.mode and the sim keys of SIM_KEYS for a config file: values[key] where `mode` reads the key, its
    unset value elsewhere (ValueError on an unknown mode: a config file's bad argument)."""
    if mode not in MODES:
        raise ValueError(f"unknown simulator mode {mode!r}; one of {', '.join(MODES)}")
    return {"mode": mode, **{key: values[key] if key in MODES[mode].reads else unset
                             for key, unset in SIM_KEYS.items()}}


def make_mode(config) -> SimulatorMode:
    """The mode `config.sim.mode`, checked: ConfigError naming the key on an unknown mode, a sim key the
    mode needs but lacks or does not read but is set, or a contract of the mode."""
    name = config.sim.mode
    if name not in MODES:
        raise ConfigError(f"config key 'sim.mode' is {name!r}; one of {', '.join(MODES)}")
    mode = MODES[name](config)
    mode.check()
    for key, unset in SIM_KEYS.items():
        value = config.sim[key]
        if key in mode.reads and _unset(value, unset):
            raise ConfigError(f"config key 'sim.{key}' must be set in mode {name}")
        if key not in mode.reads and not _unset(value, unset):
            raise ConfigError(f"config key 'sim.{key}' is {value!r}, but mode {name} does not read it; "
                              f"set it to {unset!r}")
    objective(config.sim.objective)
    if config.sim.data_coef < 0:
        raise ConfigError(f"config key 'sim.data_coef' is {config.sim.data_coef}; it must be >= 0")
    if config.sim.data_coef and not mode.sim_trains:
        raise ConfigError(f"config key 'sim.data_coef' is {config.sim.data_coef}, but no simulator trains in "
                          f"mode {name}")
    if config.sim.data_coef and not config.sim.data:
        raise ConfigError(f"config key 'sim.data_coef' is {config.sim.data_coef}, but no user data is "
                          "configured for the data anchor (config key 'sim.data' is empty)")
    return mode


def _unset(value: Any, unset: Any) -> bool:
    return tuple(value) == unset if isinstance(unset, tuple) else value == unset
