"""An episode as plain data (JSON-able), for the samples a run writes and the jobs' dialogue files."""

from __future__ import annotations

from typing import Any

from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import ROLES, Episode


def transcript(env: Environment, episode: Episode) -> dict[str, Any]:
    """What each role was told, the messages, how the episode ended, its rewards."""
    return {"scenario": str(episode.scenario), "group": episode.group, "sim_index": episode.sim_index,
            "system": {role: env.system_prompt(episode.scenario, role) for role in ROLES},
            "messages": [{"role": m.role, "text": m.text} for m in episode.messages],
            "end_reason": episode.end_reason, "rewards": episode.rewards}
