"""The regret objective: the exact best response on device, a table agent in the rollout, and the
best response's episodes in the simulators' batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.algorithms import ADVANTAGES
from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed import arms, rl, user_data
from tests.testbed.conftest import RL

N = personas.N_STATES


@pytest.fixture(scope="module")
def sim_tables(pretrained, graphdef):
    """The pretrained collapsed and base transformer simulators [2] and their reply tables [2, N, S, U]."""
    sims = jax.tree.map(lambda c, b: jnp.stack([c[0, 0], b[0]]), pretrained.collapsed, pretrained.base)
    read = jax.jit(jax.vmap(lm.sim_reply_table, in_axes=(None, 0, None)), static_argnums=0)
    return sims, read(graphdef, sims, lm.NO_CARD)


def _decisions(agent_view: np.ndarray) -> list[tuple[int, int]]:
    """(decision state, act) of every agent decision in episodes [B, L] in the agent's view (forced ASK
    excluded)."""
    out = []
    for tokens in agent_view:
        history = []
        for t in range(personas.TURNS):
            act = int(tokens[2 * t + 1]) - lm.AGENT0
            out.append((personas.state_index(history), act))
            if act == personas.ASK:
                break
            history.append((act, int(tokens[2 * t + 2]) - lm.USER0))
    return out


def test_device_best_response_is_optimal_by_policy_evaluation(sim_tables):
    """Through the callback under vmap (as in the seeds' vmap): its value equals backward induction's,
    and no one-step deviation at a state it reaches gains (`personas.policy_value`, a forward sum)."""
    _, q = sim_tables
    policies = np.asarray(jax.jit(jax.vmap(lm.best_response))(q))
    for table, policy in zip(np.asarray(q), policies):
        table = lm.as_table(table)
        assert ((policy == 0) | (policy == 1)).all() and (policy.sum(-1) == 1).all()
        value = personas.policy_value(policy, table)
        assert value == pytest.approx(personas.best_response(table).value, abs=1e-12)
        reached = np.flatnonzero(personas.reach_probabilities(policy, table) > 0)
        assert len(reached) > 1 + personas.N_USER  # it plays strategies: deviations below the root count
        for i in reached:
            for a in range(personas.N_AGENT):
                deviated = policy.copy()
                deviated[i] = np.eye(personas.N_AGENT)[a]
                assert personas.policy_value(deviated, table) <= value + 1e-12, (i, a)


def test_table_agent_plays_its_table_at_the_tracked_state(sim_tables, graphdef):
    """Two members, each with its own random deterministic table: every decision is its member's table's
    act at the history's state, and episode frequencies match `personas.episodes` exactly enumerated."""
    sims, q = sim_tables
    n = 4096
    rng = np.random.default_rng(0)
    acts = np.where(rng.random((2, N)) < 0.15, personas.ASK, rng.integers(0, personas.N_STRATEGIES, (2, N)))
    acts[:, 0] = (personas.EMOTION, personas.LOGICAL)  # a strategy first: the episodes reach deeper states
    tables = np.eye(personas.N_AGENT, dtype=np.float32)[acts]
    play = jax.jit(lambda policies, key: lm.play(lm.table_agent(policies, n), graphdef, sims,
                                                 jnp.full((2,), lm.NO_CARD), jnp.asarray(False), key, 2, n))
    d = play(jnp.asarray(tables), jax.random.key(7))
    tokens = np.asarray(d.tokens).reshape(2, n, -1)
    for p in range(2):
        decisions = _decisions(tokens[p])
        assert all(act == acts[p, state] for state, act in decisions)
        assert len({state for state, _ in decisions}) > 10
        exact = personas.episodes(tables[p].astype(np.float64), lm.as_table(q[p]))
        probs = {tuple(row): prob for row, prob in zip(exact.tokens + 1, exact.probs)}  # PAD -1 -> 0
        seen, counts = np.unique(tokens[p], axis=0, return_counts=True)
        assert all(tuple(row) in probs for row in seen)  # only dialogues the exact enumeration lists
        freq = dict(zip(map(tuple, seen), counts / n))
        for row, prob in probs.items():
            assert abs(freq.get(row, 0.0) - prob) <= 4 * np.sqrt(prob * (1 - prob) / n) + 1 / n, (row, prob)


@pytest.fixture(scope="module")
def step_batches(pretrained, graphdef, program_p1):
    """One step's batches, adversarial and regret + data (the scarce-data arms' program, with a data
    anchor the adversarial program ignores), on the same state, key and inputs."""
    regret = rl.make_runner(graphdef, graphdef, RL, 1, RL.sim_kl_coef, data_coef=4.0, best_response=True)
    sims = jax.tree.map(lambda x: x[0, :1], pretrained.collapsed)
    agent = jax.tree.map(lambda x: x[0], pretrained.agent)
    train = user_data.split(user_data.draw(user_data.DataConfig(sizes=(40,))), 40, 0.1).train
    data = jax.tree.map(lambda x: x[None], user_data.token_batch(train, 50))
    inputs = rl.arm_inputs(np.full(1, lm.NO_CARD), np.zeros((RL.steps, 1), np.int32), False, 5e-3,
                           arms.OBJECTIVES["regret"].sign, data, [len(train.strategies)])
    state = program_p1.init(agent, sims, sims, jax.random.key(1))
    out = {name: jax.jit(program.step_batch)(state, jax.random.key(2), 0, inputs)[1]
           for name, program in (("adversarial", program_p1), ("regret", regret))}
    return out, sims, (regret, inputs, len(train.strategies))


def test_regret_batch_adds_the_best_responses_episodes_with_plus_reward_advantages(step_batches, graphdef):
    batches, sims, _ = step_batches
    adversarial, regret = batches["adversarial"], batches["regret"]
    M = RL.episodes
    for got, want in zip(jax.tree.leaves(regret.agent), jax.tree.leaves(adversarial.agent)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert regret.sims.tokens.shape == (1, 2 * M, lm.SEQ_LEN)
    for got, want in zip(jax.tree.leaves(regret.sims), jax.tree.leaves(adversarial.sims)):
        np.testing.assert_array_equal(np.asarray(got)[:, :M], np.asarray(want))
    # The second half: episodes of the exact best response to the simulator's replies (solved here on the
    # host, not through the callback) ...
    q = lm.as_table(jax.jit(lm.sim_reply_table, static_argnums=0)(
        graphdef, jax.tree.map(lambda x: x[0], sims), lm.NO_CARD))
    best = personas.best_response(q).policy.argmax(-1)
    episodes = np.asarray(regret.sims.tokens)[0, M:]
    assert (episodes[:, 0] == lm.NO_CARD).all()
    assert all(act == best[state] for state, act in _decisions(episodes[:, 1:]))
    # ... with the GRPO advantages of + their reward, recomputed from their replies.
    mask = np.asarray(regret.sims.loss_mask)[0, M:] > 0
    replies = np.where(mask, episodes - lm.USER0, 0)
    rewards = personas.reward((personas.SCORE_WEIGHTS[replies] * mask).sum(-1))
    expected = ADVANTAGES[RL.advantage](jnp.asarray(rewards, jnp.float32), jnp.arange(M) // RL.group_size,
                                        RL.groups)
    advantages = np.asarray(regret.sims.advantages)[0, M:]
    assert np.abs(advantages).max() > 0.5
    np.testing.assert_allclose(advantages, np.asarray(expected), atol=1e-5)


def test_the_regret_batch_keeps_the_data_anchor(step_batches):
    """Regret + data (the scarce-data arms): the simulators' batch holds the anchor's rows, drawn from the
    data, beside the best response's episodes."""
    batches, _, (program, inputs, rows) = step_batches
    assert batches["adversarial"].sim_data is None
    assert batches["regret"].sim_data is not None, "the regret program dropped the data anchor"
    anchor = program.anchor(inputs.data, jax.random.key(2))
    np.testing.assert_array_equal(np.asarray(batches["regret"].sim_data.tokens), np.asarray(anchor.tokens))
    data = set(map(tuple, np.asarray(inputs.data.tokens)[0, :rows]))
    assert set(map(tuple, np.asarray(anchor.tokens)[0])) <= data


def test_regret_needs_simulators_that_train():
    arms.Arm("regret", "regret", "cotrain", objective="regret")
    for mode, start in (("frozen", "collapsed"), ("verbalized", "collapsed"), ("selfplay", "selfplay")):
        with pytest.raises(ValueError, match="regret objective"):
            arms.Arm("regret", "regret", mode, start=start, objective="regret")


def test_a_regret_run_solves_the_best_response_every_k_steps(pretrained, graphdef, monkeypatch):
    """best_response_every = 3 over 6 steps: the host's backward induction (counted) runs twice, at steps
    0 and 3, neither every step nor never (a small program: 8 episodes a step, one seed, one member)."""
    config = dataclasses.replace(RL, steps=6, eval_every=6, groups=2, group_size=4, best_response_every=3)
    program = rl.make_runner(graphdef, graphdef, config, 1, 0.0, best_response=True)
    solved = []
    solve = personas.best_response
    monkeypatch.setattr(personas, "best_response", lambda table: solved.append(None) or solve(table))
    sims = jax.tree.map(lambda x: x[:, :1], pretrained.collapsed)
    inputs = rl.arm_inputs(np.full(1, lm.NO_CARD), np.zeros((config.steps, 1), np.int32), False, 5e-3,
                           arms.OBJECTIVES["regret"].sign)
    _, logs, _ = program.run(pretrained.agent, sims, sims, inputs, jax.random.split(jax.random.key(3), 1))
    assert np.asarray(logs.reward).shape == (1, config.steps)
    assert len(solved) == config.steps // config.best_response_every
