"""Shared by the testbed tests: one small pretraining (one seed) and the compiled RL programs."""

import jax
import pytest

from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.testbed import rl
from scope_jax.testbed.pretrain import PretrainConfig, model_config, pretrain

QUICK = PretrainConfig(num_layers=1, agent_steps=40, sim_steps=120, collapse_steps=40,
                       heldout_priors=((0.25, 0.25, 0.25, 0.25),))
# A short RL run: 12 steps of 32 episodes; the P = 1 program has no simulator KL term (the KL-0 arms).
RL = rl.RLConfig(steps=12, eval_every=6, groups=4, group_size=8, learning_rate=5e-3, sim_learning_rate=5e-3,
                 sim_kl_coef=0.0)


@pytest.fixture(scope="session")
def pretrained():
    return pretrain(QUICK, seeds=(0,), collapse_personas=(personas.EMOTIONAL,), heldout_seeds=(101,))


@pytest.fixture(scope="session")
def graphdef():
    return decoder.init(model_config(QUICK), seed=0)[0]


@pytest.fixture(scope="session")
def program_p1(graphdef):
    return rl.make_runner(graphdef, graphdef, RL, 1, RL.sim_kl_coef)


@pytest.fixture(scope="session")
def program_p4(graphdef):
    return rl.make_runner(graphdef, graphdef, RL, 4, 1.0)


def seeds_axis(tree, n: int = 1):
    """A leading seed axis of size n."""
    return jax.tree.map(lambda x: jax.numpy.repeat(x[None], n, axis=0), tree)
