"""The token language, Verbalized Sampling parse/repair in jnp, device rollouts and exact read-outs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.models import decoder
from scope_jax.models.tiny import tiny_config
from scope_jax.testbed.pretrain import model_config
from tests.testbed.conftest import QUICK

CONFIG = tiny_config(lm.VOCAB_SIZE, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def models():
    """A random agent and a random simulator (P = 1, stacked)."""
    graphdef, agent = decoder.init(CONFIG, seed=0)
    _, sim = decoder.init(CONFIG, seed=1)
    return graphdef, agent, jax.tree.map(lambda x: x[None], sim)


def test_vocabulary_shifts_the_games_tokens():
    assert lm.TOKEN_NAMES[lm.GREETING] == "greeting"
    assert lm.TOKEN_NAMES[lm.ASK_TOKEN] == personas.AGENT_ACTS[personas.ASK]
    assert lm.TOKEN_NAMES[lm.USER0 + personas.SHARE_PERSONAL] == "share_personal"
    assert lm.TOKEN_NAMES[lm.NO_CARD] == "card:none" and lm.TOKEN_NAMES[-1] == "p=1.0"
    i = personas.state_index(((personas.EMOTION, personas.NEGATIVE),
                              (personas.PERSONAL_INQUIRY, personas.ASK_INFO)))
    expected = np.array(personas.history_tokens(personas.STATE_HISTORIES[i])) + 1
    np.testing.assert_array_equal(lm.STATE_TOKENS[i], expected)
    assert lm.STATE_TOKENS[0].tolist() == [lm.GREETING, lm.PAD, lm.PAD, lm.PAD, lm.PAD]


def test_verbalize_lists_acts_by_probability_in_tenths_that_sum_to_one():
    dist = np.array([[0.375, 0.317, 0.18, 0.098, 0.03], [0.0, 0.0, 1.0, 0.0, 0.0]])
    tokens = lm.verbalize(dist)
    acts, bins = tokens[:, 0::2] - lm.USER0, tokens[:, 1::2] - lm.BIN0
    assert acts[0].tolist() == [0, 1, 2, 3, 4] and bins[0].tolist() == [4, 3, 2, 1, 0]
    assert acts[1, 0] == 2 and bins[1].tolist() == [10, 0, 0, 0, 0]
    parsed = lm.parse_verbalized(jnp.asarray(tokens))
    np.testing.assert_allclose(parsed.probs, [[0.4, 0.3, 0.2, 0.1, 0.0], [0, 0, 1, 0, 0]], atol=1e-6)
    assert not parsed.malformed.any() and not parsed.repaired.any()


def test_parse_repairs_repeats_and_flags_malformed():
    u, b = lm.USER0, lm.BIN0
    # act 1 twice: first kept
    repeated = [u + 1, b + 6, u + 1, b + 3, u + 0, b + 2, u + 2, b + 0, u + 3, b + 0]
    # act where a bin belongs
    wrong_kind = [u + 1, u + 2, u + 0, b + 2, u + 2, b + 0, u + 3, b + 0, u + 4, b + 0]
    no_mass = [u + 0, b, u + 1, b, u + 2, b, u + 3, b, u + 4, b]
    card = [lm.NO_CARD] + repeated[1:]
    parsed = lm.parse_verbalized(jnp.asarray([repeated, wrong_kind, no_mass, card]))
    np.testing.assert_allclose(parsed.probs[0], [0.25, 0.75, 0, 0, 0], atol=1e-6)
    assert parsed.repaired.tolist() == [True, False, False, False]
    assert parsed.malformed.tolist() == [False, True, True, True]
    np.testing.assert_allclose(parsed.probs[1:], 0.2)  # a harmless placeholder; the caller falls back


def test_agent_table_matches_the_models_next_token_distribution(models):
    graphdef, agent, _ = models
    table = np.asarray(jax.jit(lm.agent_policy_table, static_argnums=0)(graphdef, agent))
    for i in (0, 7, 51, 1234, personas.N_STATES - 1):
        n = personas.STATE_LENGTH[i]
        tokens = jnp.asarray(lm.STATE_TOKENS[i, :n])[None]
        logits, _ = decoder.forward(graphdef, agent, tokens, lm.positions_like(tokens))
        expected = jax.nn.softmax(logits[0, -1, lm.AGENT0:lm.AGENT0 + personas.N_AGENT])
        np.testing.assert_allclose(table[i], expected, atol=1e-6)


def test_agent_tables_gradient_matches_one_full_forward_over_every_state(models):
    """The level-by-level pass (copies of the parent's cache) against one forward over every state's whole
    history."""
    graphdef, agent, _ = models

    def full_forward(params):
        logits = lm.last_logits(graphdef, params, jnp.asarray(lm.STATE_TOKENS), jnp.asarray(lm.STATE_LAST))
        return lm.act_distribution(logits, lm.AGENT0, personas.N_AGENT)

    weights = jax.random.normal(jax.random.key(5), (personas.N_STATES, personas.N_AGENT))
    grad = lambda table: jax.jit(jax.grad(lambda p: jnp.sum(weights * table(p))))(agent)
    expected = grad(full_forward)
    for got, want in zip(jax.tree.leaves(grad(lambda p: lm.agent_policy_table(graphdef, p))),
                         jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.abs(want).max()))


def test_sim_table_matches_full_forwards(models):
    graphdef, _, sims = models
    sim = jax.tree.map(lambda x: x[0], sims)
    card = lm.card_token(personas.SKEPTIC)
    table = np.asarray(jax.jit(lm.sim_reply_table, static_argnums=0)(graphdef, sim, card))
    for i, s in ((0, 3), (40, 9), (2000, 0)):
        n = personas.STATE_LENGTH[i]
        tokens = jnp.asarray([[card, *lm.STATE_TOKENS[i, :n], lm.AGENT0 + s]])
        logits, _ = decoder.forward(graphdef, sim, tokens, lm.positions_like(tokens))
        np.testing.assert_allclose(table[i, s],
                                   jax.nn.softmax(logits[0, -1, lm.USER0:lm.USER0 + personas.N_USER]),
                                   atol=1e-6)


def _rollout(models, verbalized: bool, n: int):
    graphdef, agent, sims = models
    run = jax.jit(lm.rollout, static_argnums=(0, 2, 7, 8))
    return run(graphdef, agent, graphdef, sims, jnp.asarray([lm.NO_CARD]), jnp.asarray(verbalized),
               jax.random.key(3), 1, n)


def test_rollout_reward_matches_the_exact_value_of_the_read_out_tables(models):
    """The device rollout samples the distributions the exact evaluation reads out."""
    graphdef, agent, sims = models
    n = 4096
    d = _rollout(models, False, n)
    policy = lm.as_table(jax.jit(lm.agent_policy_table, static_argnums=0)(graphdef, agent))
    table = lm.as_table(jax.jit(lm.sim_reply_table, static_argnums=0)(
        graphdef, jax.tree.map(lambda x: x[0], sims), lm.NO_CARD))
    rewards = np.asarray(d.rewards)
    assert abs(rewards.mean() - personas.policy_value(policy, table)) < 4 * rewards.std() / np.sqrt(n)
    early = np.mean(np.asarray(d.tokens)[:, -1] != lm.ASK_TOKEN)
    asked_now = policy[0, personas.ASK]
    assert early >= asked_now - 4 * np.sqrt(asked_now / n)
    # Views: every episode ends with the donation request, the agent trains on its decisions only, the
    # simulator sees its card and then the agent's view, and trains on reply acts only.
    tokens = np.asarray(d.tokens)
    assert (tokens[np.arange(n), np.argmax(tokens == lm.ASK_TOKEN, 1)] == lm.ASK_TOKEN).all()
    mask = np.asarray(d.agent_mask)
    assert mask[:, 0::2].sum() == 0 and (mask[:, -1] == 0).all()
    sim_tokens, sim_mask = np.asarray(d.sim_tokens)[0], np.asarray(d.sim_mask)[0]
    assert (sim_tokens[:, 0] == lm.NO_CARD).all()
    np.testing.assert_array_equal(sim_tokens[:, 1:], tokens[:, :-1])
    replies = sim_tokens[sim_mask > 0] - lm.USER0
    assert replies.min() >= 0 and replies.max() < personas.N_USER
    assert sim_mask.sum() == np.asarray(d.replied).sum()
    assert not np.asarray(d.verbalized).any() and not np.asarray(d.malformed).any()


def test_verbalized_rollout_counts_every_turn_as_used_or_fallen_back(models):
    d = _rollout(models, True, 512)
    replied, used, malformed = (np.asarray(x) for x in (d.replied, d.verbalized, d.malformed))
    np.testing.assert_array_equal(replied, used | malformed)
    assert not (used & malformed).any()
    assert malformed.sum() > 0  # a random model rarely writes 5 well-formed (act, bin) pairs


def test_train_step_log_probs_reproduce_the_behaviour_log_probs(models):
    """Constrained decoding: the loss's restricted softmax gives the sampler's log-probs (ratio 1)."""
    from scope_jax.logprobs import token_logprobs

    graphdef, agent, sims = models
    d = _rollout(models, False, 64)
    stats = token_logprobs(graphdef, agent, d.tokens, lm.positions_like(d.tokens), allowed=lm.AGENT_ACTS)
    mask = np.asarray(d.agent_mask) > 0
    np.testing.assert_allclose(np.asarray(stats.logprobs)[mask], np.asarray(d.agent_logprobs)[mask],
                               atol=1e-5)
    sim = jax.tree.map(lambda x: x[0], sims)
    sim_stats = token_logprobs(graphdef, sim, d.sim_tokens[0], lm.positions_like(d.sim_tokens[0]),
                               allowed=lm.REPLY_ACTS)
    sim_mask = np.asarray(d.sim_mask[0]) > 0
    np.testing.assert_allclose(np.asarray(sim_stats.logprobs)[sim_mask],
                               np.asarray(d.sim_logprobs[0])[sim_mask], atol=1e-5)


def test_verbalized_table_falls_back_to_direct_replies_where_malformed(models):
    graphdef, _, sims = models
    sim = jax.tree.map(lambda x: x[0], sims)
    stated, malformed = jax.jit(lm.verbalized_table, static_argnums=(0, 4))(graphdef, sim, lm.NO_CARD,
                                                                            jax.random.key(0), 2)
    direct = jax.jit(lm.sim_reply_table, static_argnums=0)(graphdef, sim, lm.NO_CARD)
    malformed = np.asarray(malformed)
    assert malformed.shape == (personas.N_STATES, personas.N_STRATEGIES)
    assert set(np.unique(malformed)) <= {0, .5, 1}
    always = malformed == 1.0  # both samples malformed: the direct replies
    assert always.any()
    np.testing.assert_allclose(np.asarray(stated)[always], np.asarray(direct)[always], atol=1e-6)
    np.testing.assert_allclose(np.asarray(stated).sum(-1), 1.0, atol=1e-5)


def test_verbalized_replies_are_what_a_verbalized_rollout_answers(pretrained):
    """The estimated VS reply distribution at the first turn against the rollout's empirical replies."""
    graphdef, _ = decoder.init(model_config(QUICK), seed=0)
    agent = jax.tree.map(lambda x: x[0], pretrained.agent)
    sim = jax.tree.map(lambda x: x[0, 0], pretrained.collapsed)
    direct = jax.jit(lm.sim_reply_table, static_argnums=0)(graphdef, sim, lm.NO_CARD)[:1]
    replies = lambda p, d, k: lm.verbalized_replies(graphdef, p, lm.NO_CARD, d, np.zeros(1, int), k, 256)
    q, malformed = jax.jit(replies)(sim, direct, jax.random.key(5))
    assert float(malformed.mean()) < 0.5  # it verbalizes
    n = 4096
    rollout = jax.jit(lm.rollout, static_argnums=(0, 2, 7, 8))
    d = rollout(graphdef, agent, graphdef, jax.tree.map(lambda x: x[None], sim), jnp.asarray([lm.NO_CARD]),
                jnp.asarray(True), jax.random.key(6), 1, n)
    first, reply = np.asarray(d.tokens)[:, 1] - lm.AGENT0, np.asarray(d.tokens)[:, 2] - lm.USER0
    for s in np.unique(first[first < personas.N_STRATEGIES]):
        replies = reply[first == s]
        if len(replies) < 300:
            continue
        counts = np.bincount(replies, minlength=personas.N_USER) / len(replies)
        expected = np.asarray(q[0, s])
        tolerance = 4 * np.sqrt(expected * (1 - expected) / len(replies)) + 0.03  # + the estimate's own noise
        assert (np.abs(counts - expected) < tolerance).all(), (s, counts, expected)
