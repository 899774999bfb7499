import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope_jax.algorithms import ADVANTAGES, grpo

EPS = 1e-6
# One group of 4 (id 5) and one of 3 (id 2), interleaved and not contiguous, and a singleton (id 0).
REWARDS = jnp.array([1.0, 0.0, 3.0, 0.0, 1.0, 6.0, 0.0, 7.0])
IDS = jnp.array([5, 5, 2, 5, 5, 2, 2, 0])
NUM_GROUPS = 8

# Fixed shapes for the property tests, so each jitted function compiles once: 12 rollouts in up to 4 groups
# of varying sizes (some possibly empty, or of size 1), with num_groups larger than the largest id.
N = 12
rewards_st = hnp.arrays(np.float32, N, elements=st.floats(-10, 10, width=32))
ids_st = hnp.arrays(np.int32, N, elements=st.integers(0, 3))
JITTED = {name: jax.jit(fn, static_argnames="num_groups") for name, fn in ADVANTAGES.items()}


def test_grpo_by_hand():
    # group 5: rewards 1,0,0,1 -> mean 0.5, deviations +-0.5, sample variance 4 * 0.25 / 3
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    # group 2: rewards 3,6,0 -> mean 3, deviations 0,3,-3, sample variance 18 / 2 = 9, std 3
    b = 3.0 / (3.0 + EPS)
    expected = [a, -a, 0.0, -a, a, b, -b, 0.0]
    np.testing.assert_allclose(JITTED["grpo"](REWARDS, IDS, NUM_GROUPS), expected, rtol=1e-6)


def test_dr_grpo_by_hand():
    expected = [0.5, -0.5, 0.0, -0.5, 0.5, 3.0, -3.0, 0.0]
    np.testing.assert_allclose(JITTED["dr_grpo"](REWARDS, IDS, NUM_GROUPS), expected, rtol=1e-6)


def test_rloo_by_hand():
    # each reward minus the mean of the others in its group
    expected = [
        1.0 - (0 + 0 + 1) / 3, 0.0 - (1 + 0 + 1) / 3, 3.0 - (6 + 0) / 2, 0.0 - (1 + 0 + 1) / 3,
        1.0 - (1 + 0 + 0) / 3, 6.0 - (3 + 0) / 2, 0.0 - (3 + 6) / 2, 0.0,
    ]
    np.testing.assert_allclose(JITTED["rloo"](REWARDS, IDS, NUM_GROUPS), expected, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_singleton_and_constant_groups_get_exactly_zero(name):
    # 0.9 summed three times and divided by 3 in float32 is an ulp off 0.9: a plain mean would leave a
    # residue that grpo divides by eps.
    rewards = jnp.array([0.9, 0.9, 0.9, 4.0, 0.9, 0.3], jnp.float32)
    ids = jnp.array([1, 1, 1, 2, 3, 3])
    advantages = JITTED[name](rewards, ids, num_groups=4)
    assert advantages.dtype == jnp.float32
    np.testing.assert_array_equal(advantages[:4], 0.0)
    assert advantages[4] != 0.0


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
@settings(max_examples=40, deadline=None)
@given(rewards=rewards_st, ids=ids_st)
def test_advantages_sum_to_zero_in_each_group(name, rewards, ids):
    advantages = np.asarray(JITTED[name](rewards, ids, num_groups=5))
    assert np.all(np.isfinite(advantages))
    for g in np.unique(ids):
        in_group = ids == g
        scale = 1.0 + np.abs(rewards[in_group]).max() * in_group.sum()
        assert abs(advantages[in_group].sum()) <= 1e-5 * scale


@settings(max_examples=40, deadline=None)
@given(rewards=rewards_st, ids=ids_st)
def test_grpo_groups_have_unit_sample_std(rewards, ids):
    advantages = np.asarray(JITTED["grpo"](rewards, ids, num_groups=5))
    for g in np.unique(ids):
        group_rewards = rewards[ids == g].astype(np.float64)
        if group_rewards.size >= 2 and group_rewards.std() > 1e-2:
            np.testing.assert_allclose(advantages[ids == g].std(ddof=1), 1.0, rtol=1e-3)


def test_rejects_bad_shapes_and_float_ids():
    with pytest.raises(AssertionError):
        grpo(jnp.zeros((2, 3)), jnp.zeros((2, 3), jnp.int32), 1)
    with pytest.raises(AssertionError):
        grpo(jnp.zeros(4), jnp.zeros(3, jnp.int32), 1)
    with pytest.raises(AssertionError):
        grpo(jnp.zeros(4), jnp.zeros(4), 1)
