"""Supervised fine-tuning data: written dialogues turned into one role's token view, and length buckets.

A dialogue to imitate is an `Episode` whose messages are text (human turns, a transcript). The view of
the imitated role is grown exactly as a model speaker grows it in a rollout (`RoleView.next_prompt`,
`add_prompt`, `add_reply`): before each of the role's turns the prompt since its last reply, then its
reply. A written reply enters the view as if the role had sampled it: its text's tokens followed by the
tokenizer's stop token (`teacher_forced`); a message that already holds sampled ids (from a rollout)
keeps them. The environment's opening messages are context, as in a rollout. So SFT and RL train on
identical tokens, and the loss mask is 1 on the role's own replies only.

Batches are length buckets: the dialogues sorted by view length and cut into batches of consecutive
ones, each right-padded to its longest view (rounded up to `batch.LENGTH_MULTIPLE`, so the number of
distinct shapes, and compiles, stays small); each epoch visits the buckets in a fresh order that is a
function of (seed, epoch) only, so a resumed run sees the same batches.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import Episode, Message
from scope_jax.dialogue.views import RoleView, template_tools
from scope_jax.training.batch import TokenBatch, role_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def teacher_forced(message: Message, tokenizer: PreTrainedTokenizerBase) -> Message:
    """`message` as a reply its role sampled: its own sampled ids if it has them, else the tokens of its
    text followed by the stop token (log-probs 0: nothing reads them in SFT)."""
    if message.sampled_ids is not None:
        return message
    ids = (*tokenizer(message.text, add_special_tokens=False).input_ids, tokenizer.eos_token_id)
    return dataclasses.replace(message, sampled_ids=ids, logprobs=(0.0,) * len(ids), stopped=True)


def dialogue_view(env: Environment, episode: Episode, role: str,
                  tokenizer: PreTrainedTokenizerBase) -> RoleView:
    """`role`'s token view of the finished dialogue `episode` of `env`, grown turn by turn as in a rollout
    (the role's system prompt and template tools are the environment's); it ends with the role's last
    reply. The environment's opening messages (`env.opening`) are context, as in a rollout, also where
    they are the role's own; every later message of the role is a reply it learns."""
    system_prompt, tools = env.system_prompt(episode.scenario, role), template_tools(env, role)
    opening = len(env.opening(episode.scenario))
    view = RoleView()
    for i, message in enumerate(episode.messages):
        if message.role == role and i >= opening:
            view.add_prompt(view.next_prompt(tokenizer, system_prompt, episode.messages[:i], role, tools))
            view.add_reply(teacher_forced(message, tokenizer))
    return view


def weight_last_reply(view: RoleView, weight: float) -> RoleView:
    """`view` with the loss mask of its last reply (the tokens after its last prompt) times `weight`: in
    P4G the persuadee's last reply is its answer to the closing question. The SFT loss is a token mean
    weighted by the mask, so this reply's tokens count `weight` times."""
    if not view.prompt_lengths:
        raise ValueError("a view without a reply has no last reply to weight")
    last = view.prompt_lengths[-1]
    mask = view.loss_mask[:last] + [m * weight for m in view.loss_mask[last:]]
    return dataclasses.replace(view, loss_mask=mask)


def token_batch(views: Sequence[RoleView], pad_id: int, length: int | None = None) -> TokenBatch:
    """The views [N] right-padded as the RL batch pads them (`batch.role_batch`, to `length` or the
    default padded length), as a TokenBatch."""
    rows = role_batch(views, np.zeros(len(views)), pad_id, length)
    return TokenBatch(tokens=rows.tokens, positions=rows.positions, loss_mask=rows.loss_mask)


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Rows of consecutive length, `batch_size` each: `buckets[b]` are indices into the views (a short
    last bucket is dropped, counted in `dropped`)."""

    buckets: tuple[tuple[int, ...], ...]
    dropped: int

    @classmethod
    def by_length(cls, lengths: Sequence[int], batch_size: int) -> "Buckets":
        order = np.argsort(np.asarray(lengths), kind="stable")
        full = len(order) // batch_size
        if not full:
            raise ValueError(f"{len(order)} dialogues do not fill one batch of {batch_size}")
        buckets = tuple(tuple(int(i) for i in order[b * batch_size:(b + 1) * batch_size])
                        for b in range(full))
        return cls(buckets, len(order) - full * batch_size)

    def at_step(self, step: int, seed: int) -> tuple[int, ...]:
        """The bucket of train step `step`: epoch step // len(buckets), in that epoch's shuffled order."""
        epoch, index = divmod(step, len(self.buckets))
        order = np.random.default_rng([seed, epoch]).permutation(len(self.buckets))
        return self.buckets[order[index]]
