"""The environment interface: everything task-specific the dialogue loop needs, and nothing else.

It lives with the dialogue loop that calls it; the environments (`scope_jax.envs`) implement it.

An environment supplies scenarios (a persona, a task), each role's system prompt, optional opening
messages, what happens after each turn (parse a tool call and append its result, detect an end
signal), and the rewards once an episode is over. Text in, text out: tokenisation, sampling and
training are the dialogue loop's business.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

import numpy as np

from scope_jax.dialogue.episode import Episode, Message


@dataclasses.dataclass
class TurnResult:
    """After a turn: messages to append (tool results, notices), whether the episode ends, and who speaks
    next (None: the other role; e.g. "agent" to let the agent act again after a tool result)."""

    messages: list[Message] = dataclasses.field(default_factory=list)
    done: bool = False
    reason: str = ""
    next_speaker: str | None = None


class Environment(Protocol):
    first_speaker: str  # "agent" or "sim"
    max_turns: int | Mapping[str, int]  # turns per role: one cap for both, or {"agent": n, "sim": m}

    def sample_scenarios(self, n: int, rng: np.random.Generator, split: str = "train") -> list[Any]:
        """n scenarios (personas, tasks) of a data split."""

    def system_prompt(self, scenario: Any, role: str) -> str:
        """What `role` ("agent" or "sim") is told before the dialogue."""

    def opening(self, scenario: Any) -> list[Message]:
        """Messages that start the dialogue before any model speaks (may be empty)."""

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        """React to `message`, just appended to `episode` (tool calls, end signals)."""

    # Optional: def closing(self, episode: Episode) -> list[Message]
    #     Called once for each episode still running after the last regular turn: messages to append (a
    #     survey question such as P4G's "how much do you donate?") that the simulator then answers in one
    #     extra turn; [] for none. Environments without it end at the turn limit.

    # Optional: def template_tools(self, role: str) -> Sequence[dict]
    #     The function schemas of `role`'s tools for its chat template's `tools=` (see
    #     scope_jax.dialogue.views); environments without it, or [] for a role: no tools.

    def rewards(self, episode: Episode) -> dict[str, float]:
        """Rewards of a finished episode: {"agent": r, "sim": r_sim} (other keys are logged)."""
