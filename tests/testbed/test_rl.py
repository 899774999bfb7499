"""`testbed.rl.make_runner`: what each arm's data does to the compiled RL program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.envs import persona_lm as lm
from scope_jax.envs import personas
from scope_jax.testbed import arms, rl
from tests.testbed.conftest import RL, seeds_axis

KEYS = jax.random.split(jax.random.key(0), 1)
REPLIES = (personas.POSITIVE, personas.NEGATIVE, personas.NEUTRAL, personas.SHARE_PERSONAL)


def _inputs(members, voices=None, verbalized=False, sim_lr=0.0):
    voices = np.broadcast_to(np.arange(members), (RL.steps, members)) if voices is None else voices
    return rl.arm_inputs(np.full(members, lm.NO_CARD), voices, verbalized, sim_lr,
                         arms.OBJECTIVES["adversarial"].sign)


def _collapsed(pretrained, members=1):
    return jax.tree.map(lambda x: jnp.repeat(x[:, :1], members, axis=1), pretrained.collapsed)


@pytest.fixture(scope="module")
def frozen_and_trained(pretrained, program_p1):
    """The same collapsed simulator frozen (rate 0) and co-trained, from the pretrained agent."""
    sims = _collapsed(pretrained)
    return {rate: program_p1.run(pretrained.agent, sims, sims, _inputs(1, sim_lr=rate), KEYS)
            for rate in (0.0, RL.sim_learning_rate)}


def test_frozen_arm_leaves_simulator_parameters_bit_identical(pretrained, frozen_and_trained):
    state, _, snaps = frozen_and_trained[0.0]
    leaves = zip(jax.tree.leaves(_collapsed(pretrained)), jax.tree.leaves(state.params["sims"]),
                 jax.tree.leaves(snaps.sims))
    for before, after, snap in leaves:
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
        np.testing.assert_array_equal(np.asarray(snap),
                                      np.broadcast_to(np.asarray(before)[:, None], snap.shape))
    moved = [np.abs(np.asarray(a) - np.asarray(b)).max()
             for a, b in zip(jax.tree.leaves(state.params["agent"]), jax.tree.leaves(pretrained.agent))]
    assert max(moved) > 1e-3  # the agent trained


def test_trained_arm_moves_simulator_parameters_without_a_kl_term(pretrained, frozen_and_trained):
    assert RL.sim_kl_coef == 0.0  # the program has no KL term (these arms crashed before)
    state, logs, _ = frozen_and_trained[RL.sim_learning_rate]
    moved = [np.abs(np.asarray(a) - np.asarray(b)).max()
             for a, b in zip(jax.tree.leaves(state.params["sims"]), jax.tree.leaves(_collapsed(pretrained)))]
    assert max(moved) > 1e-3
    assert not np.asarray(logs.skipped).any()


def test_a_short_frozen_run_raises_the_exact_training_value(pretrained, graphdef, frozen_and_trained):
    state, _, _ = frozen_and_trained[0.0]
    sim = lm.as_table(jax.jit(lm.sim_reply_table, static_argnums=0)(
        graphdef, jax.tree.map(lambda x: x[0, 0], pretrained.collapsed), lm.NO_CARD))
    table = jax.jit(lm.agent_policy_table, static_argnums=0)
    first = lambda tree: jax.tree.map(lambda x: x[0], tree)
    value = lambda agents: personas.policy_value(lm.as_table(table(graphdef, first(agents))), sim)
    before, after = value(pretrained.agent), value(state.params["agent"])
    assert after > before + 0.02, (before, after)


def test_verbalized_sampling_changes_the_reply_distribution(pretrained, program_p1):
    sims = _collapsed(pretrained)
    logs = {vs: program_p1.run(pretrained.agent, sims, sims, _inputs(1, verbalized=vs), KEYS)[1]
            for vs in (False, True)}
    direct, stated = (float(np.mean(logs[vs].sampled_deviation)) for vs in (False, True))
    assert float(np.mean(logs[True].vs_malformed)) < 0.5
    assert float(np.mean(logs[False].vs_malformed)) == 0.0
    # the collapsed model states a spread-out distribution; its direct replies are near-deterministic
    assert stated > direct + 0.1, (direct, stated)


def _constant_player(params, reads, says, among):
    """A decoder whose constrained choice among `among` is always `says` right after any token of `reads`:
    zero output projections leave the residual stream at the token's embedding, and the tied embedding
    makes the logits rmsnorm(e) . (+-10 e)."""
    emb = np.array(params["embed_tokens"]["embedding"])
    e = np.zeros(emb.shape[1], np.float32)
    e[0] = 1.0
    emb[list(reads)] = e
    emb[list(among)] = -10 * e
    emb[says] = 10 * e
    out = jax.tree.map(jnp.asarray, params)
    layers = out["layers"]
    layers["self_attn"]["o_proj"]["kernel"] = jnp.zeros_like(layers["self_attn"]["o_proj"]["kernel"])
    layers["mlp"]["down_proj"]["kernel"] = jnp.zeros_like(layers["mlp"]["down_proj"]["kernel"])
    out["embed_tokens"]["embedding"] = jnp.asarray(emb)
    return out


@pytest.fixture(scope="module")
def constant_players(pretrained):
    """An agent that always plays the logical appeal (3 strategies per episode) and four simulators,
    member p always giving REPLIES[p], so an episode's reward says which member answered it."""
    one = jax.tree.map(lambda x: x[0], pretrained.agent)
    agent = _constant_player(one, (lm.GREETING,) + lm.REPLY_ACTS, lm.AGENT0 + personas.LOGICAL, lm.AGENT_ACTS)
    sims = [_constant_player(one, lm.AGENT_ACTS, lm.USER0 + u, lm.REPLY_ACTS) for u in REPLIES]
    rewards = personas.reward(personas.TURNS * personas.SCORE_WEIGHTS[list(REPLIES)])
    return seeds_axis(agent), seeds_axis(jax.tree.map(lambda *x: jnp.stack(x), *sims)), rewards


def test_each_population_member_voices_its_own_block(program_p4, constant_players):
    agent, sims, rewards = constant_players
    _, logs, _ = program_p4.run(agent, sims, sims, _inputs(4), KEYS)
    blocks = np.asarray(logs.rewards)[0].reshape(RL.steps, 4, -1)
    np.testing.assert_allclose(blocks, np.broadcast_to(rewards[None, :, None], blocks.shape), rtol=1e-5)


def test_rotation_changes_the_voicing_simulator_on_its_schedule(program_p4, constant_players):
    agent, sims, rewards = constant_players
    block = 3
    voices = arms.voices(arms.ARMS["rotation"], RL.steps, block)
    _, logs, _ = program_p4.run(agent, sims, sims, _inputs(4, voices), KEYS)
    per_step = np.asarray(logs.rewards)[0]  # [steps, B]
    expected = rewards[(np.arange(RL.steps) // block) % 4]  # member 0 for 3 steps, then 1, 2, 3
    np.testing.assert_allclose(per_step, np.broadcast_to(expected[:, None], per_step.shape), rtol=1e-5)


def test_self_play_update_carries_the_simulator_roles_gradient(pretrained, graphdef):
    program = rl.make_runner(graphdef, graphdef, RL, 1, 1.0, self_play=True)
    joint = jax.tree.map(lambda x: x[0], pretrained.agent)
    as_sims = jax.tree.map(lambda x: x[None], joint)
    state = program.init(joint, as_sims, as_sims, jax.random.key(1))
    rollout = jax.jit(lm.rollout, static_argnums=(0, 2, 7, 8))
    d = rollout(graphdef, joint, graphdef, as_sims, jnp.asarray([lm.NO_CARD]), jnp.asarray(False),
                jax.random.key(2), 1, RL.episodes)
    batch = program.batch(d, jnp.asarray(-1.0))
    no_agent = batch.replace(agent=batch.agent.replace(advantages=jnp.zeros_like(batch.agent.advantages)))
    neither = no_agent.replace(sims=no_agent.sims.replace(advantages=jnp.zeros_like(batch.sims.advantages)))
    step = jax.jit(program.train_step)
    moved = lambda b: max(float(jnp.abs(a - o).max()) for a, o in zip(
        jax.tree.leaves(step(state, b)[0].params["agent"]), jax.tree.leaves(joint)))
    assert float(jnp.abs(batch.sims.advantages).max()) > 0
    assert moved(no_agent) > 1e-4  # only the simulator role has advantages: the shared weights still move
    assert moved(neither) == 0.0  # and nothing else moves them (the KL term's gradient is 0 at the start)
