"""The arms of the collapse experiment: which simulators the same agent trains against, and how.

Every arm starts from the same pretrained agent and runs the same RL (`rl.make_runner`); they differ in
data only:

  untrained   no RL: the pretrained (P4G-behaviour) agent.
  frozen      one frozen, mode-collapsed simulator (the "aligned" one, no card).
  verbalized  the same collapsed model, answering by Verbalized Sampling.
  cotrain     Co-Training: the base (pre-alignment) simulator is trained on the same episodes against
              the agent (adversarial: advantages of minus the agent's reward), with a KL anchor to its
              initial policy.
  cotrain_collapsed
              Co-Training started from the collapsed (aligned) simulator, anchored to the base one:
              the simulator one has is trained back towards the population while the agent trains.
  population  Population Co-Training: P = 4 simulators started from the persona modes (the base
              simulator shown each persona's card), trained adversarially, each anchored to its start.
  rotation    several frozen simulators taken in turn (one block of groups each): the collapsed models
              that the same alignment-like step makes from each persona mode, i.e. four "aligned models"
              collapsed in different directions.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed.pretrain import Pretrained


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    label: str
    members: int = 1  # P, the simulator population (shapes the compiled program)
    start: str = "collapsed"  # "collapsed", "base", "persona_modes" (base with cards), "collapsed_modes"
    verbalized: bool = False
    train_sims: bool = False

    @property
    def trains(self) -> bool:
        return self.name != "untrained"


ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    Arm("untrained", "untrained (no RL)"),
    Arm("frozen", "single frozen simulator"),
    Arm("verbalized", "Verbalized Sampling", verbalized=True),
    Arm("cotrain", "Co-Training", start="base", train_sims=True),
    Arm("cotrain_collapsed", "Co-Training from the collapsed simulator", train_sims=True),
    Arm("population", "Population Co-Training (P=4)", members=4, start="persona_modes", train_sims=True),
    Arm("rotation", "rotation (4 frozen)", members=4, start="collapsed_modes"),
)}
FIXES = ("verbalized", "cotrain", "population", "rotation", "cotrain_collapsed")  # compared with frozen


def collapse_personas(arm_names) -> tuple[int, ...]:
    """The personas the alignment-like step collapses onto: emotional first, all four for rotation."""
    if "rotation" in arm_names:
        return tuple(range(len(personas.PERSONAS)))
    return (personas.EMOTIONAL,)


def cards(arm: Arm) -> jax.Array:
    """[P] prompt cards: persona cards for the persona modes, "no card" otherwise."""
    if arm.start == "persona_modes":
        return jnp.asarray([lm.card_token(p) for p in range(arm.members)], jnp.int32)
    return jnp.full((arm.members,), lm.NO_CARD, jnp.int32)


def simulators(arm: Arm, pre: Pretrained) -> tuple:
    """(initial simulators [R, P], KL references [R, P]) of an arm."""
    repeat = lambda tree: jax.tree.map(lambda x: jnp.repeat(x[:, None], arm.members, axis=1), tree)
    base = repeat(pre.base)
    if arm.start in ("base", "persona_modes"):
        return base, base
    if arm.start == "collapsed_modes":
        if jax.tree.leaves(pre.collapsed)[0].shape[1] != arm.members:
            raise ValueError("rotation needs one collapsed simulator per member")
        return pre.collapsed, base
    emotional = jax.tree.map(lambda x: x[:, :1], pre.collapsed)  # collapse persona 0 is the emotional one
    return jax.tree.map(lambda x: jnp.repeat(x, arm.members, axis=1), emotional), base
