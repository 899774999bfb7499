"""Messages and episodes: the host-side record of a dialogue between the agent and a simulator."""

from __future__ import annotations

import dataclasses
from typing import Any

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
    prompt_ids: tuple[int, ...] | None = None  # the prompt the role saw when it generated this message


@dataclasses.dataclass
class Episode:
    """One dialogue: its scenario, messages so far, whether it ended, and its rewards.

    `sim_index` is the population member that plays the simulator; `group` ties the rollouts of one
    scenario together for group-relative advantages.
    """

    scenario: Any
    group: int
    sim_index: int = 0
    messages: list[Message] = dataclasses.field(default_factory=list)
    done: bool = False
    end_reason: str = ""
    rewards: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def turns(self, role: str) -> int:
        return sum(m.role == role for m in self.messages)
