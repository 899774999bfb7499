"""The simulators' data anchor in the dialogue loop: user dialogues in the trained simulator's view.

`sim.data` names the user dialogues, "SOURCE:SPLIT": "p4g_human:train" is the human Persuasion for Good
dialogues of the environment's train split of participants (`envs.p4g_human`, each cut to the run's
`env.max_turns` turns per role and closed by the participant's real donation). Each is written in the
simulator's token view as SFT writes it (`sft_data.dialogue_view`: the tokens RL would train on), and
each train step draws the anchor's rows, [P, M, L] (M rows per member, as many as the member's own
episodes on this process), with replacement, from (seed, step, process): a resumed run draws what an
uninterrupted one would. The simulators' loss adds `sim.data_coef` x their NLL (`training.loss.nll_loss`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from scope_jax import distributed
from scope_jax.config import ConfigError
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import SIM, Episode
from scope_jax.dialogue.views import RoleView
from scope_jax.envs.p4g import P4GEnv
from scope_jax.envs.p4g_human import HumanDialogues
from scope_jax.training.batch import TokenBatch, padded_length
from scope_jax.training.sft_data import dialogue_view, token_batch


def p4g_human(env: Environment, split: str) -> list[Episode]:
    if not isinstance(env, P4GEnv):
        raise ConfigError(f"config key 'sim.data' names the P4G human dialogues, but the environment is "
                          f"{type(env).__name__}, not P4G")
    if split not in env.splits:
        raise ConfigError(f"config key 'sim.data' names the split {split!r}; one of {', '.join(env.splits)}")
    return HumanDialogues.load(env, split, env.max_turns).episodes


SOURCES: dict[str, Callable[[Environment, str], list[Episode]]] = {"p4g_human": p4g_human}


@dataclasses.dataclass(frozen=True)
class DataAnchor:
    """The anchor's dialogues in the simulator's view, and how a step draws its rows."""

    views: tuple[RoleView, ...]
    pad_id: int
    seed: int

    @classmethod
    def load(cls, spec: str, env: Environment, tokenizer, seed: int) -> "DataAnchor":
        source, _, split = spec.partition(":")
        if source not in SOURCES or not split:
            raise ConfigError(f"config key 'sim.data' is {spec!r}; write SOURCE:SPLIT with SOURCE one of "
                              f"{', '.join(SOURCES)}")
        episodes = SOURCES[source](env, split)
        if not episodes:
            raise ConfigError(f"config key 'sim.data' is {spec!r}, which holds no dialogues")
        views = tuple(dialogue_view(env, e, SIM, tokenizer) for e in episodes)
        return cls(views, tokenizer.pad_token_id or 0, seed)

    def rows(self, step: int, members: int, per_member: int) -> TokenBatch:
        """This process's anchor rows of train step `step`: [members, per_member, L], L agreed by the
        processes."""
        rng = np.random.default_rng([self.seed, step, jax.process_index()])
        views = [self.views[i] for i in rng.integers(len(self.views), size=members * per_member)]
        rows = token_batch(views, self.pad_id, distributed.agreed_max(padded_length(views)))
        return jax.tree.map(lambda x: np.asarray(x).reshape(members, per_member, -1), rows)
