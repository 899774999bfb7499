"""Target word: the smallest dialogue task that needs both roles and can be learned in a few dozen steps.

The user (simulator) opens by asking for a word ("say apple"); the agent is rewarded for each of its
turns that contains that word; the simulator answers in between. A random agent hits the word by
chance (about max_new_tokens / vocabulary per turn), so the reward rises quickly under RL. The
simulator's reward is the agent's (a shared task). Used by the engine's end-to-end test and as the
example config `experiments/configs/target_word.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message

TARGETS = ("apple", "banana", "cherry", "grape")
FILLER = ("say", "please", "the", "word", "yes", "no", "ok", "thanks", "hello", "what", "now", "again")


@dataclasses.dataclass
class TargetWordEnv:
    """targets: the words a scenario may ask for; max_turns: turns per role."""

    targets: tuple[str, ...] = TARGETS
    max_turns: int = 2
    first_speaker: str = AGENT

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("target_word targets is empty; a scenario asks for one of them")
        turns = self.max_turns  # an int, or a cap per role
        if (turns.get(self.first_speaker, 0) if isinstance(turns, Mapping) else turns) < 1:
            raise ValueError(f"target_word max_turns is {turns}; the first speaker's must be at least 1")

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return self.targets + FILLER

    def sample_scenarios(self, n: int, rng: np.random.Generator, split: str = "train") -> list[Any]:
        return [self.targets[i] for i in rng.integers(0, len(self.targets), n)]

    def system_prompt(self, scenario: Any, role: str) -> str:
        return "say the word" if role == AGENT else f"ask for {scenario}"

    def opening(self, scenario: Any) -> list[Message]:
        return [Message(SIM, f"say {scenario} please")]

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        return TurnResult()

    def rewards(self, episode: Episode) -> dict[str, float]:
        turns = [m.text.split() for m in episode.messages if m.role == AGENT]
        hit = float(np.mean([episode.scenario in words for words in turns])) if turns else 0.0
        return {"agent": hit, "sim": hit}
