"""What a train step consumes: for each role, token-exact sequences with masks and advantages."""

from __future__ import annotations

import chex
import jax
from flax import struct


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
class Batch:
    """agent: RoleBatch [N, L]; sims: RoleBatch [P, M, L] or None when no simulator trains."""

    agent: RoleBatch
    sims: RoleBatch | None = None
