"""Pretraining: the alignment-like collapse step makes the simulator less diverse than the base one."""

import jax
import numpy as np

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.testbed import pretrain as pt
from tests.testbed.conftest import QUICK


def test_collapsed_simulator_deviates_less_than_the_base_simulator(pretrained):
    graphdef, _ = decoder.init(pt.model_config(QUICK), seed=0)
    tabulate = jax.jit(lm.sim_reply_table, static_argnums=0)
    policy = lm.as_table(jax.jit(lm.agent_policy_table, static_argnums=0)(
        graphdef, jax.tree.map(lambda x: x[0], pretrained.agent)))
    base = lm.as_table(tabulate(graphdef, jax.tree.map(lambda x: x[0], pretrained.base), lm.NO_CARD))
    collapsed = lm.as_table(tabulate(graphdef, jax.tree.map(lambda x: x[0, 0], pretrained.collapsed),
                                     lm.NO_CARD))
    base_dev = personas.simulator_deviation(policy, base)
    collapsed_dev = personas.simulator_deviation(policy, collapsed)
    assert collapsed_dev < base_dev - 0.1, (collapsed_dev, base_dev)
    # and it collapsed towards agreement: positive replies dominate, negative ones have (almost) vanished
    weights = personas.reach_probabilities(policy, collapsed)[:, None] * policy[:, :personas.N_STRATEGIES]
    mean_reply = np.einsum("is,isu->u", weights, collapsed) / weights.sum()
    assert mean_reply[personas.POSITIVE] > 0.5 and mean_reply[personas.NEGATIVE] < 0.05


def test_pretrained_agent_follows_p4g_frequencies(pretrained):
    graphdef, _ = decoder.init(pt.model_config(QUICK), seed=0)
    policy = np.asarray(jax.jit(lm.agent_policy_table, static_argnums=0)(
        graphdef, jax.tree.map(lambda x: x[0], pretrained.agent)))
    p4g = personas.p4g_policy()[0]
    assert 0.5 * np.abs(policy[0] - p4g).sum() < 0.1
    assert policy[:, personas.ASK].max() < 0.05  # it asks only when forced


def test_verbalization_examples_state_the_predictive_after_the_prompt():
    rng = np.random.default_rng(0)
    d = pt.sample_dialogues(rng, 8, pt.UNIFORM, pt.PERSONA_TABLES, np.zeros(8, np.int64))
    predictive = personas.base_simulator()
    tokens, mask = pt.verbalization_examples(rng, d, predictive, 8)
    for i, (row, m) in enumerate(zip(tokens, mask)):  # example i comes from dialogue i
        request = int(np.flatnonzero(row == lm.VS_REQUEST)[0])
        assert row[0] == lm.NO_CARD and row[1] == lm.GREETING and request % 2 == 1
        assert np.flatnonzero(m).tolist() == list(range(request + 1, request + 1 + lm.VS_LENGTH))
        t = (request - 3) // 2
        state = personas.state_index(tuple(zip(row[2:request - 1:2] - lm.AGENT0,
                                               row[3:request - 1:2] - lm.USER0)))
        assert state == d.states[i, t]
        stated = lm.parse_verbalized(row[request + 1:request + 1 + lm.VS_LENGTH]).probs
        exact = predictive[state, row[request - 1] - lm.AGENT0]
        assert np.abs(np.asarray(stated) - exact).max() <= 0.1
