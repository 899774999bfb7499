"""The scarce-data arms' mechanisms (issue 33): bootstrap resamples, population members fitted on their
own resamples and anchored to them, the data anchor in the tabular regret gradient (the neural batch's:
tests/testbed/test_regret.py), the calibrated temperature, the regret metric, and the objective tables
of the dialogue loop and the testbed agreeing."""

import jax
import numpy as np
import pytest

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.simulators import modes
from scope_jax.testbed import arms, evaluate, experiment, fitting, tabular, user_data

DATA = user_data.DataConfig(sizes=(40,))


@pytest.fixture(scope="module")
def part():
    return user_data.split(user_data.draw(DATA), 40, DATA.heldout_fraction)


def _rows(d: user_data.Dialogues) -> set:
    return {tuple(np.concatenate([s, r])) for s, r in zip(d.strategies, d.replies)}


def test_bootstrap_resamples_differ_by_member_and_seed_and_repeat_for_the_same_seed(part):
    members = user_data.resamples(part.train, DATA, 40, 4)
    again = user_data.resamples(part.train, DATA, 40, 4)
    other = user_data.resamples(part.train, user_data.DataConfig(sizes=(40,), seed=DATA.seed + 1), 40, 4)
    n = len(part.train.strategies)
    for p, d in enumerate(members):
        assert len(d.strategies) == n and _rows(d) <= _rows(part.train)
        assert len(_rows(d)) < len(_rows(part.train))  # with replacement: some repeat, some are left out
        for x, y in zip(d, again[p]):
            np.testing.assert_array_equal(x, y)
        assert not np.array_equal(d.replies, other[p].replies)
    assert len({d.replies.tobytes() for d in members}) == 4


class RecordingFitter:
    """Stands in for `fitting.Fitter`: records what each fit starts from and is fitted on."""

    def __init__(self):
        self.calls = []

    def fit_replies(self, params, train, heldout, *args, **kwargs):
        self.calls.append((np.asarray(params["w"]), train.tokens))
        return params, np.zeros(1)


def test_each_population_member_is_fitted_on_its_own_resample_from_its_own_collapsed_model(part):
    fitter = RecordingFitter()
    collapsed = {"w": np.arange(4.0)[None, :, None]}  # [R = 1, C = 4, 1]: model p holds p
    out = fitting.fit_to_data(fitter, collapsed, user_data.draw(DATA), DATA, (fitting.POPULATION,),
                              lambda message: None)
    assert np.asarray(out[fitting.POPULATION][40]["w"]).shape == (1, 4, 1)
    full = user_data.token_batch(part.train).tokens
    resamples = user_data.resamples(part.train, DATA, 40, 4)
    for p, ((start, tokens), resample) in enumerate(zip(fitter.calls, resamples)):
        assert start.item() == p
        np.testing.assert_array_equal(tokens, user_data.token_batch(resample).tokens)
        assert not np.array_equal(tokens, full)


def test_a_population_members_data_anchor_is_its_own_resample(part):
    resamples = user_data.resamples(part.train, DATA, 40, 4)
    fitted = experiment.Fitted({}, {}, {40: part}, {40: resamples}, {})
    regret = {arm.start: arm for arm in arms.scarce_arms(40, 16.0) if arm.data_coef}
    population, single = regret["fitted_population"], regret["fitted"]
    anchor = experiment.anchor_data(population, fitted, 50)
    assert anchor["data"].tokens.shape == (4, 50, lm.SEQ_LEN)
    assert anchor["rows"] == [len(part.train.strategies)] * 4
    for p, d in enumerate(resamples):
        np.testing.assert_array_equal(anchor["data"].tokens[p], user_data.token_batch(d, 50).tokens)
    one = experiment.anchor_data(single, fitted, 50)
    np.testing.assert_array_equal(one["data"].tokens[0], user_data.token_batch(part.train, 50).tokens)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_tabular_regret_and_data_gradient_is_that_of_regret_minus_the_weighted_nll(part):
    """Against central differences of the numpy regret (personas) minus coef x the NLL of the counts."""
    rng = np.random.default_rng(5)
    agent = rng.normal(size=tabular.AGENT_SHAPE).astype(np.float32)
    sim = rng.normal(size=tabular.SIM_SHAPE).astype(np.float32)
    counts = user_data.reply_counts(part.train)
    s = tabular.setting(tabular.OBJECTIVES["regret"], 0.0, 0.1, sim, data_coef=3.0, data_counts=counts)
    g = np.asarray(jax.jit(jax.grad(tabular.sim_gain))(sim, jax.nn.softmax(agent), s), np.float64)
    policy = _softmax(agent.astype(np.float64))

    def gain(logits):
        q = _softmax(logits)
        nll = -np.sum(counts * np.log(q)) / counts.sum()
        return personas.best_response(q).value - personas.policy_value(policy, q) - 3.0 * nll

    seen = counts.sum(-1) > 0  # a direction on the contexts the data speak at, where the anchor pulls
    d = rng.normal(size=sim.shape) * seen[..., None]
    h = 1e-4
    numeric = (gain(sim.astype(np.float64) + h * d) - gain(sim.astype(np.float64) - h * d)) / (2 * h)
    assert np.sum(g * d) == pytest.approx(numeric, rel=1e-3, abs=1e-6)


def test_a_tempered_model_divides_every_reply_logit_by_its_temperature(pretrained, graphdef):
    read = jax.jit(lm.sim_reply_table, static_argnums=0)
    collapsed = jax.tree.map(lambda x: x[:, 0], pretrained.collapsed)  # [R = 1]
    table = lm.as_table(read(graphdef, jax.tree.map(lambda x: x[0], collapsed), lm.NO_CARD))
    hot = fitting.tempered(collapsed, np.array([2.0]))
    got = lm.as_table(read(graphdef, jax.tree.map(lambda x: x[0], hot), lm.NO_CARD))
    np.testing.assert_allclose(got, _softmax(np.log(table) / 2.0), atol=2e-5)
    assert np.abs(got - table).max() > 0.05


def test_calibration_undoes_a_known_sharpening():
    """Replies drawn from the base simulator; the base table sharpened to T = 0.5 is best at T = 2."""
    heldout = user_data.draw(user_data.DataConfig(sizes=(1000,)))
    sharp = user_data.temper(personas.base_simulator(), 0.5)
    assert user_data.calibrate(sharp, heldout) == 2.0
    assert user_data.calibrate(personas.base_simulator(), heldout) == 1.0


def test_regret_is_zero_for_the_best_response_and_the_value_gap_otherwise():
    q = personas.collapsed_simulator()
    best = personas.best_response(q)
    assert abs(evaluate.regret(best.policy, q)) < 1e-12
    p4g = personas.p4g_policy()
    assert evaluate.regret(p4g, q) == pytest.approx(best.value - personas.policy_value(p4g, q))
    assert evaluate.regret(p4g, q) > 0.05


def test_the_objective_tables_agree_on_names_and_signs():
    """simulators.modes (the dialogue loop), testbed.arms (neural) and testbed.tabular: an objective of
    two of them has the same sign (and the same best-response term) in both."""
    rewards = {"agent": 1.0, "sim": 1.0}  # a shared reward, as the persona game's
    known = set(modes.OBJECTIVES) | set(modes.UNAVAILABLE_OBJECTIVES)
    assert set(arms.OBJECTIVES) <= known
    for name, objective in arms.OBJECTIVES.items():
        if name in modes.OBJECTIVES:
            assert modes.OBJECTIVES[name](rewards) == objective.sign, name
        assert name in tabular.OBJECTIVES, name
        assert tabular.OBJECTIVES[name].sign == objective.sign, name
        assert bool(tabular.OBJECTIVES[name].best_response) == objective.best_response, name
    for name, objective in tabular.OBJECTIVES.items():  # the tabular-only ones are a neural one + a bonus
        if name not in arms.OBJECTIVES:
            base = next(b for b in arms.OBJECTIVES if name.startswith(f"{b}_"))
            assert objective.sign == arms.OBJECTIVES[base].sign and objective.entropy_coef > 0, name
