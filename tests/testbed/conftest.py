"""A small pretraining shared by the testbed tests (one seed, quick sizes)."""

import pytest

from scope_jax.envs import personas
from scope_jax.testbed.pretrain import PretrainConfig, pretrain

QUICK = PretrainConfig(agent_steps=40, sim_steps=120, collapse_steps=40,
                       heldout_priors=((0.25, 0.25, 0.25, 0.25),))


@pytest.fixture(scope="session")
def pretrained():
    return pretrain(QUICK, seeds=(0,), collapse_personas=(personas.EMOTIONAL,), heldout_seeds=(101,))
