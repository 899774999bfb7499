"""The arms of the collapse experiment: which simulators the same agent trains against, and how.

A *mode* says how the simulator side answers and what trains, with the same meaning as in the dialogue
loop:

  frozen      fixed simulators; member p answers the episodes of block p.
  verbalized  a fixed simulator answering by Verbalized Sampling.
  cotrain     Co-Training: one simulator trained on the same episodes, by default adversarially
              (advantages of minus the agent's reward) with a KL anchor to a reference; its
              objective is data (`OBJECTIVES`: adversarial, cooperative, regret).
  population  Population Co-Training: P simulators, member p trained on its own block.
  rotation    P fixed simulators taken in turn: every episode of a step is answered by one of them,
              the next one after `RLConfig.rotation_block` steps.
  mixture     P fixed simulators within every step: member p answers block p.
  selfplay    one transformer plays both roles (its user role behind the prompt card slot, which the
              agent's view never holds) and receives both roles' gradients.

An *arm* is a mode plus where its simulators start and what they are anchored to, and, for the data
arms, how many user dialogues (`testbed.user_data`) their simulators see: fitted to them before RL
(start "fitted"; "fitted_calibrated", the fit at the softmax temperature chosen on the held-out
dialogues; "fitted_population", four fits on bootstrap resamples, each from a different collapsed
model; or "vs_fitted" for Verbalized Sampling taught their reply frequencies), or as a data anchor of
Co-Training (`data_coef` x the NLL of their replies in the simulator's loss; a population member's on
its own resample). Every arm starts from
the same pretrained agent (self-play: the joint model's agent role) and runs the same RL
(`rl.make_runner`); apart from the population size P and self-play, they differ in data only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed.pretrain import Pretrained


@dataclasses.dataclass(frozen=True)
class Mode:
    trains_sims: bool
    verbalized: bool = False
    rotates: bool = False
    self_play: bool = False


MODES: dict[str, Mode] = {
    "frozen": Mode(False), "verbalized": Mode(False, verbalized=True), "cotrain": Mode(True),
    "population": Mode(True), "rotation": Mode(False, rotates=True), "mixture": Mode(False),
    "selfplay": Mode(True, self_play=True),
}
# Where the simulators start: their pretrained models, and how many members that makes.
STARTS = {"collapsed": 1, "base": 1, "collapsed_modes": len(personas.PERSONAS),
          "persona_modes": len(personas.PERSONAS), "selfplay": 1, "fitted": 1, "vs_fitted": 1,
          "fitted_calibrated": 1, "fitted_population": len(personas.PERSONAS)}
# made from the collapsed simulator(s) and `Arm.data` dialogues
FITTED_STARTS = ("fitted", "vs_fitted", "fitted_calibrated", "fitted_population")


@dataclasses.dataclass(frozen=True)
class Objective:
    """A trained simulator's objective: advantages of `sign` x the agent's reward on the agent's episodes
    and, with `best_response`, of + the reward on episodes the exact best response to the simulator's
    current replies plays against it (regret = V(best response) - V(agent), PAIRED's oracle form)."""

    sign: float
    best_response: bool = False


OBJECTIVES = {"adversarial": Objective(-1.0), "cooperative": Objective(1.0),
              "regret": Objective(-1.0, best_response=True)}


@dataclasses.dataclass(frozen=True)
class Arm:
    """start: "collapsed" (the emotional collapsed simulator), "base" (pre-alignment), "collapsed_modes"
    (the four collapsed simulators, one per collapse direction), "persona_modes" (the base simulator
    shown each persona's card) or "selfplay" (the joint model). anchor: the KL reference of trained
    simulators, "start" (each its own start) or "base". sim_kl_coef / sim_learning_rate: None takes
    the run's `RLConfig` values (the sweep sets them per arm). start "fitted" (the collapsed simulator
    fine-tuned on `data` user dialogues) or "vs_fitted" (the collapsed simulator taught to state their
    reply frequencies). data / data_coef: the user dialogues the simulators see, and the weight of
    their NLL in a co-trained simulator's loss (the data anchor)."""

    name: str
    label: str
    mode: str | None  # None: no RL
    start: str = "collapsed"
    anchor: str = "start"
    objective: str = "adversarial"
    sim_kl_coef: float | None = None
    sim_learning_rate: float | None = None
    data: int = 0
    data_coef: float = 0.0

    def __post_init__(self):
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"arm {self.name}: unknown mode {self.mode!r}; known: {', '.join(MODES)}")
        if self.start not in STARTS or self.anchor not in ("start", "base"):
            raise ValueError(f"arm {self.name}: start {self.start!r} / anchor {self.anchor!r} unknown")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"arm {self.name}: objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        grouped = self.mode in ("population", "rotation", "mixture")
        if self.mode is not None and grouped != (self.members > 1):
            raise ValueError(f"arm {self.name}: mode {self.mode} with {self.members} simulator(s)")
        if self.mode == "verbalized" and self.start not in ("collapsed", "vs_fitted"):
            raise ValueError(f"arm {self.name}: Verbalized Sampling is the collapsed simulator's")
        if (self.start == "vs_fitted") != (self.mode == "verbalized" and self.data > 0):
            raise ValueError(f"arm {self.name}: the fitted Verbalized Sampling arm and only it starts "
                             "vs_fitted")
        if (self.start in FITTED_STARTS or self.data_coef > 0) != (self.data > 0):
            raise ValueError(f"arm {self.name}: data dialogues go with a fitted start or a data anchor")
        if self.data_coef > 0 and self.mode not in ("cotrain", "population"):
            raise ValueError(f"arm {self.name}: the data anchor is (Population) Co-Training's")
        trains_own_sims = self.trains and self.spec.trains_sims and not self.spec.self_play
        if OBJECTIVES[self.objective].best_response and not trains_own_sims:
            raise ValueError(f"arm {self.name}: the regret objective needs simulators that train "
                             "(not self-play)")
        if (self.mode == "selfplay") != (self.start == "selfplay"):
            raise ValueError(f"arm {self.name}: self-play and only self-play starts from the joint model")

    @property
    def trains(self) -> bool:
        return self.mode is not None

    @property
    def members(self) -> int:
        return STARTS[self.start]

    @property
    def spec(self) -> Mode:
        return MODES[self.mode]


ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    Arm("untrained", "untrained (no RL)", None),
    Arm("frozen", "frozen collapsed simulator", "frozen"),
    Arm("frozen_base", "frozen base simulator", "frozen", start="base"),
    Arm("verbalized", "Verbalized Sampling", "verbalized"),
    Arm("cotrain", "Co-Training", "cotrain"),
    Arm("cotrain_base", "Co-Training from the base simulator", "cotrain", start="base"),
    Arm("cotrain_base_anchor", "Co-Training anchored to the base simulator", "cotrain", anchor="base"),
    Arm("population", "Population Co-Training (P=4)", "population", start="collapsed_modes"),
    Arm("population_base", "Population Co-Training from the base persona modes", "population",
        start="persona_modes"),
    Arm("rotation", "rotation (4 frozen)", "rotation", start="collapsed_modes"),
    Arm("mixture", "mixture (4 frozen)", "mixture", start="collapsed_modes"),
    Arm("selfplay", "self-play", "selfplay", start="selfplay"),
)}
CONTROLS = ("frozen", "frozen_base")  # every other trained arm is compared with both, paired by seed


def sweep_arm(kl_coef: float, learning_rate: float, objective: str = "adversarial") -> Arm:
    """Co-Training like for like (from the collapsed simulator, anchored to its start) at one setting."""
    tag = "" if objective == "adversarial" else f"_{objective}"
    label = f"Co-Training{' ' + objective if tag else ''}, KL {kl_coef:g}, simulator lr {learning_rate:g}"
    return Arm(f"cotrain{tag}_kl{kl_coef:g}_lr{learning_rate:g}", label, "cotrain", objective=objective,
               sim_kl_coef=float(kl_coef), sim_learning_rate=float(learning_rate))


def data_arms(n: int, data_coefs: tuple[float, ...]) -> tuple[Arm, ...]:
    """The arms that see n user dialogues: fitted (the control), Verbalized Sampling fitted, and
    Co-Training like for like with a data anchor at each weight."""
    return (Arm(f"fitted_n{n}", f"fitted simulator, N={n}", "frozen", start="fitted", data=n),
            Arm(f"vs_fitted_n{n}", f"Verbalized Sampling, fitted, N={n}", "verbalized", start="vs_fitted",
                data=n),
            *(Arm(f"cotrain_data{c:g}_n{n}", f"Co-Training with a data anchor {c:g}, N={n}", "cotrain",
                  data=n, data_coef=float(c)) for c in data_coefs))


def scarce_arms(n: int, data_coef: float) -> tuple[Arm, ...]:
    """The arms of the scarce-data study at n user dialogues (docs/results/README.md): fitted (the
    control), fitted calibrated, the fitted population (P = 4, played as `mixture`), and regret + data
    (`data_coef` x the data NLL) from the fit and from the population."""
    regret = dict(objective="regret", data=n, data_coef=float(data_coef))
    return (Arm(f"fitted_n{n}", f"fitted simulator, N={n}", "frozen", start="fitted", data=n),
            Arm(f"calibrated_n{n}", f"fitted, calibrated, N={n}", "frozen", start="fitted_calibrated",
                data=n),
            Arm(f"fitted_population_n{n}", f"fitted population (P=4), N={n}", "mixture",
                start="fitted_population", data=n),
            Arm(f"regret_data_n{n}", f"regret + data {data_coef:g}, N={n}", "cotrain", start="fitted",
                **regret),
            Arm(f"population_regret_data_n{n}", f"population regret + data {data_coef:g}, N={n}",
                "population", start="fitted_population", **regret))


def collapse_personas(arms: list[Arm]) -> tuple[int, ...]:
    """The personas the alignment-like step collapses onto: the emotional one (the collapsed simulator),
    and all four when an arm starts from the collapsed modes (or is fitted from them)."""
    if any(arm.start in ("collapsed_modes", "fitted_population") for arm in arms):
        return tuple(range(len(personas.PERSONAS)))
    return (personas.EMOTIONAL,)


def cards(arm: Arm) -> np.ndarray:
    """[P] prompt cards: persona cards for the persona modes, "no card" otherwise."""
    if arm.start == "persona_modes":
        return np.asarray([lm.card_token(p) for p in range(arm.members)], np.int32)
    return np.full((arm.members,), lm.NO_CARD, np.int32)


def voices(arm: Arm, steps: int, rotation_block: int) -> np.ndarray:
    """[steps, P] the member that answers block p at step t: member p, or in rotation the member
    (t // rotation_block) mod P for every block."""
    if arm.trains and arm.spec.rotates:
        turn = (np.arange(steps) // rotation_block) % arm.members
        return np.repeat(turn[:, None], arm.members, axis=1).astype(np.int32)
    return np.broadcast_to(np.arange(arm.members, dtype=np.int32), (steps, arm.members)).copy()


def simulators(arm: Arm, pre: Pretrained, fitted: dict | None = None) -> tuple:
    """(initial simulators [R, P], KL references [R, P]) of an arm, as parameter trees. fitted:
    {start: {N: params [R, P]}} for the starts in FITTED_STARTS (`testbed.fitting.fit_to_data`)."""
    members = lambda tree: jax.tree.map(lambda x: jnp.repeat(x[:, None], arm.members, axis=1), tree)
    base = members(pre.base)
    if arm.start in FITTED_STARTS:
        start = fitted[arm.start][arm.data]
    else:
        start = {
            "collapsed": lambda: jax.tree.map(lambda x: x[:, :1], pre.collapsed),  # persona 0: emotional
            "base": lambda: base,
            "collapsed_modes": lambda: pre.collapsed,
            "persona_modes": lambda: base,
            "selfplay": lambda: members(pre.selfplay),
        }[arm.start]()
    if jax.tree.leaves(start)[0].shape[1] != arm.members:
        raise ValueError(f"arm {arm.name} needs {arm.members} pretrained simulators per seed")
    return start, (start if arm.anchor == "start" else base)
