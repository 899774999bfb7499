"""Finished episodes -> the train step's Batch: each role's token views, masks and advantages."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from transformers import PreTrainedTokenizerBase

from scope_jax.algorithms import ADVANTAGES
from scope_jax.dialogue.episode import Episode
from scope_jax.dialogue.views import RoleView, role_view
from scope_jax.envs.base import Environment
from scope_jax.training.batch import RoleBatch

LENGTH_MULTIPLE = 64  # sequences are padded to a multiple of this, so batch shapes (and compiles) repeat


def group_advantages(rewards: np.ndarray, groups: np.ndarray, estimator: str) -> np.ndarray:
    """Advantages [N] of rewards [N] within groups (rollouts that share a scenario), by name."""
    _, dense = np.unique(groups, return_inverse=True)
    return np.asarray(ADVANTAGES[estimator](jnp.asarray(rewards, jnp.float32), jnp.asarray(dense),
                                            num_groups=int(dense.max()) + 1))


def final_view(env: Environment, episode: Episode, role: str, tokenizer: PreTrainedTokenizerBase) -> RoleView:
    """The view `role` trains on; every prompt it generated from must be a prefix of it."""
    view = role_view(tokenizer, env.system_prompt(episode.scenario, role), episode.messages, role,
                     add_generation_prompt=False)
    for message in episode.messages:
        if message.role == role and message.prompt_ids is not None:
            if view.ids[:len(message.prompt_ids)] != message.prompt_ids:
                raise ValueError(
                    f"a prompt the {role} sampled from is not a prefix of its training sequence (views grow "
                    "turn by turn, so its system prompt, tokenizer or earlier messages changed since)")
    return view


def pad_views(views: Sequence[RoleView], advantages: np.ndarray, pad_id: int,
              length: int | None = None) -> RoleBatch:
    """Right-pad views to `length` (default: the longest, rounded up to LENGTH_MULTIPLE)."""
    longest = max(len(v.ids) for v in views)
    length = length or -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
    if longest > length:
        raise ValueError(f"a sequence of {longest} tokens does not fit the batch length {length}")
    tokens = np.full((len(views), length), pad_id, np.int32)
    mask = np.zeros((len(views), length), np.float32)
    logprobs = np.zeros((len(views), length), np.float32)
    for row, view in enumerate(views):
        n = len(view.ids)
        tokens[row, :n], mask[row, :n], logprobs[row, :n] = view.ids, view.loss_mask, view.logprobs
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
    return RoleBatch(tokens=jnp.asarray(tokens), positions=jnp.asarray(positions),
                     loss_mask=jnp.asarray(mask), old_logprobs=jnp.asarray(logprobs),
                     advantages=jnp.asarray(advantages, jnp.float32))


def population_batch(env: Environment, episodes: Sequence[Episode], role: str,
                     tokenizer: PreTrainedTokenizerBase, advantages: np.ndarray, population: int,
                     pad_id: int) -> RoleBatch:
    """[P, M, L] batch of `role` (the simulator side) with episode e in slice e.sim_index.

    Every member must voice the same number M of episodes (assignments are balanced)."""
    order = sorted(range(len(episodes)), key=lambda i: episodes[i].sim_index)
    counts = np.bincount([e.sim_index for e in episodes], minlength=population)
    if len(set(counts.tolist())) != 1:
        raise ValueError(f"simulator assignment is unbalanced ({counts.tolist()} episodes per member)")
    views = [final_view(env, episodes[i], role, tokenizer) for i in order]
    flat = pad_views(views, advantages[order], pad_id)
    return jax.tree.map(lambda x: x.reshape((population, -1) + x.shape[1:]), flat)
