"""What a train step consumes: for each role, token-exact sequences with masks and advantages, built from
the roles' token views (`role_batch`)."""

from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scope_jax.dialogue.views import RoleView


@struct.dataclass
class RoleBatch:
    """Sequences of one role, in that role's own token view.

    tokens        [..., N, L] int32  the whole dialogue as this role's model sees it, right-padded
    positions     [..., N, L] int32  position ids (0..len-1, padding anywhere after)
    loss_mask     [..., N, L] float  1 on the tokens this role sampled, 0 on prompts, template tokens,
                                     the other role's text and padding
    old_logprobs  [..., N, L] float  behaviour log-probs returned by the sampler (0 where masked)
    advantages    [..., N]    float  one advantage per sequence

    The agent's batch is [N, L]; the simulators' batch is [P, M, L], one slice per population member.
    """

    tokens: jax.Array
    positions: jax.Array
    loss_mask: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array

    def check(self) -> None:
        chex.assert_equal_shape([self.tokens, self.positions, self.loss_mask, self.old_logprobs])
        chex.assert_equal_shape_prefix([self.tokens, self.advantages], self.advantages.ndim)
        chex.assert_rank(self.tokens, self.advantages.ndim + 1)


@struct.dataclass
class TokenBatch:
    """Sequences to imitate (supervised fine-tuning, the simulators' data anchor).

    tokens     [..., N, L] int32  right-padded token ids
    positions  [..., N, L] int32  position ids
    loss_mask  [..., N, L] float  1 on the tokens the model learns to produce (one role's tokens)
    """

    tokens: jax.Array
    positions: jax.Array
    loss_mask: jax.Array

    def check(self) -> None:
        chex.assert_equal_shape([self.tokens, self.positions, self.loss_mask])
        chex.assert_rank(self.tokens, {2, 3})


@struct.dataclass
class Batch:
    """agent: RoleBatch [N, L]; sims: RoleBatch [P, M, L] or None when no simulator trains;
    sim_data: TokenBatch [P, D, L], each member's data for the simulators' data anchor
    (`LossConfig.data_coef`), or None."""

    agent: RoleBatch
    sims: RoleBatch | None = None
    sim_data: TokenBatch | None = None


LENGTH_MULTIPLE = 64  # sequences are padded to a multiple of this, so batch shapes (and compiles) repeat


def padded_length(views: Sequence[RoleView]) -> int:
    """The longest view's length rounded up to LENGTH_MULTIPLE (at least LENGTH_MULTIPLE)."""
    return max(1, -(-max(len(v) for v in views) // LENGTH_MULTIPLE)) * LENGTH_MULTIPLE


def role_batch(views: Sequence[RoleView], advantages: np.ndarray, pad_id: int, length: int | None = None,
               members: int = 0) -> RoleBatch:
    """The views [N] right-padded to `length` (default: `padded_length(views)`; no view may be longer)
    with their advantages [N]; with `members` P, reshaped to [P, N / P, L] (views ordered by member)."""
    length = padded_length(views) if length is None else length
    if max(len(v) for v in views) > length:
        raise ValueError(f"a view of {max(len(v) for v in views)} tokens does not fit length {length}")
    tokens = np.full((len(views), length), pad_id, np.int32)
    mask = np.zeros((len(views), length), np.float32)
    logprobs = np.zeros((len(views), length), np.float32)
    for row, view in enumerate(views):
        n = len(view)
        tokens[row, :n], mask[row, :n], logprobs[row, :n] = view.ids, view.loss_mask, view.logprobs
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
    batch = RoleBatch(tokens=jnp.asarray(tokens), positions=jnp.asarray(positions),
                      loss_mask=jnp.asarray(mask), old_logprobs=jnp.asarray(logprobs),
                      advantages=jnp.asarray(advantages, jnp.float32))
    if members:
        batch = jax.tree.map(lambda x: x.reshape((members, -1) + x.shape[1:]), batch)
    batch.check()
    return batch
