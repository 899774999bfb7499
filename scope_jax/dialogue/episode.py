"""Messages and episodes: the host-side record of a dialogue between the agent and a simulator."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scope_jax.dialogue.views import RoleView

AGENT = "agent"
SIM = "sim"
ENV = "env"
ROLES = (AGENT, SIM)


@dataclasses.dataclass
class Message:
    """One turn's text, from `role` ("agent", "sim", or "env" for tool results and notices).

    A model-generated message also keeps the exact token ids it sampled (stop token included) and
    their behaviour log-probs; those ids, not a re-tokenisation of `text`, are what the role trains on.
    `visible_to` lists the roles whose context contains the message.
    """

    role: str
    text: str
    sampled_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    stopped: bool = False  # generation ended with a stop token (the last sampled id)
    visible_to: tuple[str, ...] = ROLES


@dataclasses.dataclass
class Episode:
    """One dialogue: its scenario, messages so far, who speaks next, whether it ended, and its rewards.

    `sim_index` is the simulator (population member or listed model) that plays the simulator; `group`
    ties the rollouts of one scenario together for group-relative advantages. `views` holds the token
    view of each role a model speaks (`scope_jax.dialogue.views.RoleView`), grown turn by turn: what the
    role trains on. `turns_taken` counts each role's turns (the environment's messages not included).
    """

    scenario: Any
    group: int
    sim_index: int = 0
    messages: list[Message] = dataclasses.field(default_factory=list)
    next_speaker: str = ""
    done: bool = False
    end_reason: str = ""
    rewards: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    views: dict[str, RoleView] = dataclasses.field(default_factory=dict)
    turns_taken: dict[str, int] = dataclasses.field(default_factory=dict)
