"""User data and the simulators that see it: the fits move towards the data, the data anchor's gradient
reaches the co-trained simulator (against a full-logit reference), the smoothed estimate is what it says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import forward
from scope_jax.testbed import rl, user_data
from scope_jax.testbed.fitting import Fitter
from scope_jax.testbed.pretrain import Dialogues, agent_view
from tests.testbed.conftest import RL

DATA = user_data.DataConfig(sizes=(40, 200), fit_steps=40, check_every=10, vs_steps=40)


@pytest.fixture(scope="module")
def data():
    return user_data.draw(DATA)


@pytest.fixture(scope="module")
def collapsed(pretrained):
    return jax.tree.map(lambda x: x[:, 0], pretrained.collapsed)  # [R = 1]


@pytest.fixture(scope="module")
def fitter(graphdef):
    return Fitter(graphdef, DATA.fit_learning_rate)


def reply_table(graphdef, params):
    return lm.as_table(jax.jit(lm.sim_reply_table, static_argnums=0)(graphdef, jax.tree.map(lambda x: x[0], params),
                                                                     lm.NO_CARD))


def test_the_data_are_fixed_nested_and_split_into_a_heldout_tenth(data):
    again = user_data.draw(DATA)
    for a, b in zip(data, again):
        np.testing.assert_array_equal(a, b)
    small, large = user_data.split(data, 40, 0.1), user_data.split(data, 200, 0.1)
    assert len(small.train.strategies) == 36 and len(small.heldout.strategies) == 4
    np.testing.assert_array_equal(small.train.replies, large.train.replies[:36])
    assert data.strategies.max() < personas.N_STRATEGIES  # the untrained agent asks only when it must
    batch = user_data.token_batch(small.train, 50)
    assert batch.loss_mask[:36].sum() == 36 * personas.TURNS and batch.loss_mask[36:].sum() == 0


def test_reply_estimate_is_the_smoothed_frequencies(data):
    d = user_data.split(data, 200, 0.1).train
    q = user_data.reply_estimate(d, smoothing=2.0)
    np.testing.assert_allclose(q.sum(-1), 1.0)
    # By hand at the first state: every dialogue starts there.
    s = d.strategies[0, 0]
    count = np.bincount(d.replies[d.strategies[:, 0] == s, 0], minlength=personas.N_USER)
    pooled = np.bincount(d.replies[d.strategies == s], minlength=personas.N_USER)
    backoff = (pooled + 1) / (pooled.sum() + personas.N_USER)
    np.testing.assert_allclose(q[0, s], (count + 2.0 * backoff) / (count.sum() + 2.0))
    assert user_data.reply_counts(d)[1500].sum() == 0
    np.testing.assert_allclose(q[1500, s], backoff)  # a state the data never reach: the pooled frequencies


def test_the_fitted_simulator_moves_towards_the_data(graphdef, collapsed, fitter, data):
    part = user_data.split(data, 200, 0.1)
    fitted, best_nll = fitter.fit_replies(collapsed, user_data.token_batch(part.train),
                                          user_data.token_batch(part.heldout), DATA.fit_steps, DATA.check_every,
                                          DATA.fit_batch, 0, lambda message: None)
    before, after = reply_table(graphdef, collapsed), reply_table(graphdef, fitted)
    # The NLL read from the exact reply tables (independent of the SFT loss path) drops on both parts,
    # and the fit's own held-out NLL is that of its table.
    for d in part:
        assert user_data.table_nll(after, d) < user_data.table_nll(before, d) - 0.05
    np.testing.assert_allclose(best_nll[0], user_data.table_nll(after, part.heldout), rtol=1e-4)
    # Where the data are (the first turn), the replies move towards the data's frequencies.
    counts = user_data.reply_counts(part.train)[0]
    seen = counts.sum(-1) > 20
    freq = counts[seen] / counts[seen].sum(-1, keepdims=True)
    tv = lambda table: 0.5 * np.abs(table[0, seen] - freq).sum(-1).mean()
    assert tv(after) < 0.6 * tv(before)


def test_verbalized_sampling_learns_to_state_the_estimate(graphdef, collapsed, fitter, data):
    estimate = user_data.reply_estimate(user_data.split(data, 200, 0.1).train, DATA.smoothing)
    taught = fitter.teach_verbalization(collapsed, estimate, DATA.vs_steps, DATA.vs_batch, seed=1,
                                        say=lambda message: None)
    states = np.arange(0, personas.N_STATES, 50)

    def stated(params):
        p = jax.tree.map(lambda x: x[0], params)
        direct = jnp.full((len(states), personas.N_STRATEGIES, personas.N_USER), 1.0 / personas.N_USER)
        q, _ = lm.verbalized_replies(graphdef, p, lm.NO_CARD, direct, states, jax.random.key(0), 4)
        return np.asarray(q)

    tv = lambda q: 0.5 * np.abs(q - estimate[states]).sum(-1).mean()
    assert tv(stated(taught)) < tv(stated(collapsed)) - 0.05  # a 40-step lesson of a 1-layer model


def test_the_data_anchor_gradient_reaches_the_simulator(graphdef, pretrained, collapsed, data):
    """Zero advantages and no KL: the simulator's only gradient is data_coef x the NLL of the anchor's
    rows, and Adam's first step (unit rate) moves each parameter by -g / (|g| + eps)."""
    part = user_data.split(data, 40, 0.1)
    program = rl.make_runner(graphdef, graphdef, RL, 1, 0.0, data_coef=3.0)
    plain = rl.make_runner(graphdef, graphdef, RL, 1, 0.0)
    inputs = rl.arm_inputs([lm.NO_CARD], np.zeros((RL.steps, 1)), False, 1.0, -1.0,
                           jax.tree.map(lambda x: x[None], user_data.token_batch(part.train, 50)),
                           [len(part.train.strategies)])
    anchor = program.anchor(inputs.data, jax.random.key(3))
    assert anchor.tokens.shape == (1, RL.episodes, lm.SEQ_LEN)
    n = RL.episodes  # the agent's batch: one GRPO group layout
    d = Dialogues(*(x[:n] for x in part.train))
    tokens = agent_view(d)
    agent_mask = np.zeros(tokens.shape, np.float32)
    agent_mask[:, 1:-1:2] = 1.0
    view = user_data.token_batch(d)
    dialogues = lm.Dialogues(tokens, agent_mask, np.zeros(tokens.shape, np.float32), view.tokens[None],
                             view.loss_mask[None], np.zeros((1, n, lm.SEQ_LEN), np.float32),
                             np.full((n,), 0.5, np.float32), *([None] * 6))
    agent = jax.tree.map(lambda x: x[0], pretrained.agent)
    sims = collapsed  # [P = 1]
    state = program.init(agent, sims, sims, jax.random.key(0))
    new, metrics = jax.jit(program.train_step)(state, program.batch(dialogues, jnp.asarray(-1.0), anchor))
    still, _ = jax.jit(plain.train_step)(state, plain.batch(dialogues, jnp.asarray(-1.0)))

    def reference_nll(params):
        """Mean -log softmax over the reply acts of each masked token, from the full logits."""
        batch = jax.tree.map(lambda x: x[0], anchor)
        logits, _ = forward(graphdef, params, batch.tokens, batch.positions)
        logp = jax.nn.log_softmax(logits[:, :-1, lm.USER0:lm.USER0 + personas.N_USER], axis=-1)
        picked = jnp.take_along_axis(logp, (batch.tokens[:, 1:, None] - lm.USER0).clip(0), axis=-1)[..., 0]
        mask = batch.loss_mask[:, 1:]
        return -jnp.sum(picked * mask) / jnp.sum(mask)

    member = jax.tree.map(lambda x: x[0], sims)
    grad = jax.grad(reference_nll)(member)
    for old, moved, unmoved, g in zip(jax.tree.leaves(sims), jax.tree.leaves(new.params["sims"]),
                                      jax.tree.leaves(still.params["sims"]), jax.tree.leaves(grad)):
        np.testing.assert_array_equal(unmoved, old)  # without the anchor, nothing moves the simulator
        big = np.abs(g) > 1e-5
        np.testing.assert_allclose((old - moved)[0][big], np.sign(g)[big], atol=0.02)
    np.testing.assert_allclose(metrics["sims/nll"][0], reference_nll(member), rtol=1e-5)


def test_data_arms_are_checked_when_made():
    from scope_jax.testbed.arms import Arm, data_arms

    assert [arm.name for arm in data_arms(30, (1.0, 4.0))] == [
        "fitted_n30", "vs_fitted_n30", "cotrain_data1_n30", "cotrain_data4_n30"]
    for bad in (dict(mode="frozen", start="fitted"),  # a fitted start without data
                dict(mode="frozen", data=30, data_coef=1.0),  # a data anchor on a frozen simulator
                dict(mode="cotrain", data=30),  # data with neither a fit nor an anchor
                dict(mode="verbalized", start="fitted", data=30)):  # VS of the reply-fitted model
        with pytest.raises(ValueError):
            Arm("bad", "bad", **bad)
