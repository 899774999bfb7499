"""The simulators' data anchor in the dialogue loop: user dialogues in the trained simulator's view.

`sim.data` names the user dialogues, "SOURCE:SPLIT" (`envs.user_dialogues`): "p4g_human:simulator" is the
human Persuasion for Good dialogues of the environment's simulator split of participants (`envs.p4g_human`,
each cut to the run's `env.max_turns` turns per role and closed by the participant's real donation); an
anchor is a training simulator's data, so any other split is refused (`user_dialogues.check_fit`). Each is
written in the
simulator's token view as SFT writes it (`sft_data.dialogue_view`: the tokens RL would train on), and
each train step draws the anchor's rows, [P, M, L] (M rows per member, as many as the member's own
episodes on this process), with replacement, from (seed, step, process): a resumed run draws what an
uninterrupted one would. The simulators' loss adds `sim.data_coef` x their NLL (`training.loss.nll_loss`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from scope_jax import distributed
from scope_jax.config import ConfigError
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import SIM
from scope_jax.dialogue.views import RoleView
from scope_jax.envs import user_dialogues
from scope_jax.training.batch import TokenBatch, padded_length
from scope_jax.training.sft_data import dialogue_view, token_batch


@dataclasses.dataclass(frozen=True)
class DataAnchor:
    """The anchor's dialogues in the simulator's view, and how a step draws its rows."""

    views: tuple[RoleView, ...]
    pad_id: int
    seed: int

    @classmethod
    def load(cls, spec: str, env: Environment, tokenizer, seed: int) -> "DataAnchor":
        try:
            user_dialogues.check_fit(spec, "simulator")
            episodes = user_dialogues.load(spec, env, env.max_turns).episodes
        except ValueError as e:
            raise ConfigError(f"config key 'sim.data': {e}") from None
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
