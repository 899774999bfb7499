"""Every simulator mode is a configuration of the one loop: what each mode means, checked where it acts.

End to end (slow): two training steps per mode on tiny models, with the parameters that must stay frozen
bit-identical, the ones that train moved, and the monitor's values finite. Fast: who voices the episodes
under rotation and mixture (the behaviour log-probs of each simulator turn are recomputed under every
model: only the scheduled one reproduces them), self-play's update carrying the simulator role's
gradient, co-training's adversarial default, and the verbalized path putting a stated candidate into the
dialogue.
"""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs.target_word import get_config
from experiments.run import prepare
from scope_jax.dialogue.episode import SIM, Episode
from scope_jax.logprobs import token_logprobs
from scope_jax.simulators import verbalized_speaker
from scope_jax.simulators.modes import make_mode
from scope_jax.training import rl_step
from scope_jax.training.run_dir import RunDir
from scope_jax.training.setup import build
from scope_jax.training.train import train

MONITOR_KEYS = ("agent/entropy", "monitor/zero_variance_groups", "monitor/agent_distinct_n",
                "monitor/agent_identical", "monitor/agent_sampled_entropy", "monitor/sim_sampled_entropy",
                "monitor/sim_deviation", "monitor/variance_sim_share", "heldout_reward")


def tiny(mode: str):
    config = get_config(mode)
    config.rollout.update(groups=2, group_size=4)
    config.sampling.max_new_tokens = 4
    config.verbalized.max_new_tokens = 16
    config.monitor.update(probe_contexts=2, probe_samples=2, fork_contexts=2, forks=2, branches=2)
    config.train.update(steps=2, eval_every=2, checkpoint_every=2, eval_groups=1)
    return config


def run_mode(tmp_path, mode: str):
    config = tiny(mode)
    prepare(config)
    initial = build(config).state
    with RunDir.create(tmp_path / mode, config) as run_dir:
        state, _ = train(config, run_dir)
        records = run_dir.read_metrics()
    return initial, state, records


def changed(before, after) -> list[bool]:
    return [not np.array_equal(np.asarray(b), np.asarray(a))
            for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after))]


def assert_monitor_finite(record: dict, mode: str) -> None:
    assert all(key in record for key in MONITOR_KEYS), set(MONITOR_KEYS) - set(record)
    undefined = {"monitor/sim_sampled_entropy"} if mode == "verbalized" else set()  # no sampled sim tokens
    if record["monitor/variance_sim_side"] + record["monitor/variance_agent_side"] == 0:
        undefined.add("monitor/variance_sim_share")  # no variance to split
    values = {k: v for k, v in record.items() if k.startswith("monitor/") and k not in undefined}
    assert all(np.isfinite(v) for v in values.values()), values


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["frozen", "verbalized", "rotation"])
def test_frozen_simulators_stay_bit_identical(tmp_path, mode):
    initial, state, records = run_mode(tmp_path, mode)
    assert any(changed(initial.params["agent"], state.params["agent"]))
    if mode != "rotation":  # rotation's simulators live outside the trained state
        assert not any(changed(initial.params["sims"], state.params["sims"]))
    else:
        assert "sims" not in state.params
    assert_monitor_finite(records[-1], mode)
    if mode == "verbalized":
        # A random tiny model never writes parsable verbalizations: every turn falls back, counted.
        assert records[-1]["verbalized/fallback_rate"] == 1.0
        assert records[-1]["verbalized/turns"] == 8 * 2  # 8 episodes, 2 simulator turns each


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cotrain", "population", "selfplay"])
def test_trained_simulators_change(tmp_path, mode):
    initial, state, records = run_mode(tmp_path, mode)
    if mode == "selfplay":
        assert "sims" not in state.params and all(changed(initial.params["agent"], state.params["agent"]))
    else:
        assert all(changed(initial.params["sims"], state.params["sims"]))
    if mode == "population":
        assert {"sims/entropy/0", "sims/entropy/1"} <= set(records[-1])
    assert_monitor_finite(records[-1], mode)


logprobs_of = jax.jit(token_logprobs, static_argnums=0)


def voiced_by(setup, episode: Episode) -> list[bool]:
    """For each listed simulator model: whether the behaviour log-probs of the episode's simulator turns
    are that model's (recomputed over the simulator's view; the sampling temperature is 1)."""
    view = episode.views[SIM]
    tokens = jnp.asarray([view.ids], jnp.int32)
    positions = jnp.arange(len(view))[None]
    mask = np.asarray(view.loss_mask) > 0
    recomputed = [np.asarray(logprobs_of(model.graphdef, model.params, tokens, positions).logprobs)[0]
                  for model in setup.sims.listed]
    return [bool(np.allclose(r[mask], np.asarray(view.logprobs)[mask], atol=1e-4)) for r in recomputed]


def test_each_listed_model_voices_the_episodes_of_its_schedule():
    """rotation: step s is voiced by model s mod 2 throughout; mixture (the same models): rollout k of every
    scenario by model k mod 2, in every step."""
    config = get_config("rotation")
    config.rollout.update(groups=2, group_size=2)
    config.env.max_turns = 1
    rotation = build(config)
    assert config.sampling.temperature == 1.0
    config.sim.mode = "mixture"
    mixture = dataclasses.replace(rotation, mode=make_mode(config))
    for setup, schedule in ((rotation, lambda step, k: step % 2), (mixture, lambda step, k: k % 2)):
        for step in (0, 1):
            for k, episode in enumerate(rl_step.play_episodes(setup, setup.state, step)):
                assert episode.sim_index == schedule(step, k)
                assert voiced_by(setup, episode) == [model == schedule(step, k) for model in range(2)]


def test_self_play_updates_carry_the_simulator_roles_gradient():
    """One set of weights plays both roles: with the agent's advantages 0 and the simulator's 1, the update
    moves the weights (the simulator turns' gradient), and with both roles' advantages 0 it does not. The
    KL anchor is off, so the advantages are the only source of gradient (the policy's and the frozen
    reference's log-probs of equal weights agree to round-off, not bit for bit: the policy's attention
    runs its custom VJP's forward rule)."""
    config = get_config("selfplay")
    config.rollout.update(groups=2, group_size=2)
    config.env.max_turns = 1
    config.algo.update(kl_coef=0.0, sim_kl_coef=0.0)
    setup = build(config)
    episodes = rl_step.play_episodes(setup, setup.state, 0)
    batch = rl_step.make_batch(setup, episodes, rl_step.role_advantages(setup, episodes), 0)
    assert batch.sims is not None and float(batch.sims.loss_mask.sum()) > 0
    advantage = lambda role_batch, a: role_batch.replace(advantages=jnp.full_like(role_batch.advantages, a))
    step = jax.jit(setup.train_step)
    with_sim = lambda a: batch.replace(agent=advantage(batch.agent, 0.0), sims=advantage(batch.sims, a))
    sim_only, neither = step(setup.state, with_sim(1.0)), step(setup.state, with_sim(0.0))
    assert float(sim_only[1]["grad_norm"]) > 0 and any(changed(setup.state.params, sim_only[0].params))
    assert float(neither[1]["grad_norm"]) == 0.0


def test_cotraining_is_adversarial_by_default():
    """The default objective: the simulator's reward is minus the agent's, so with one simulator its GRPO
    advantages are exactly the negated agent advantages; "cooperative" takes the environment's sim reward."""
    config = get_config("cotrain")
    assert config.sim.objective == "adversarial" and config.algo.sim_kl_coef > 0
    rng = np.random.default_rng(0)
    episodes = [Episode("apple", group=g) for g in range(3) for _ in range(4)]
    for e in episodes:
        e.rewards = {"agent": float(rng.uniform()), "sim": float(rng.uniform())}
    setup = types.SimpleNamespace(config=config, mode=make_mode(config))
    advantages = rl_step.role_advantages(setup, episodes)
    np.testing.assert_allclose(advantages["sims"], -advantages["agent"], atol=1e-5)
    config.sim.objective = "cooperative"
    sim_rewards = np.asarray([e.rewards["sim"] for e in episodes], np.float32)
    expected = rl_step.group_advantages(sim_rewards, np.asarray([e.group for e in episodes]), "grpo")
    np.testing.assert_allclose(rl_step.role_advantages(setup, episodes)["sims"], expected)


CANDIDATES = ("say apple now", "please say banana")


def test_the_verbalized_loop_path_puts_a_stated_candidate_into_the_dialogue(monkeypatch):
    """A generator that writes parsable verbalizations: every simulator turn of the step is one of the
    stated candidates (none fell back), and the step's verbalized/* metrics are those turns' records."""
    answer = ('{"responses": [{"text": "%s", "probability": 0.7}, {"text": "%s", "probability": 0.3}]}'
              % CANDIDATES)
    config = get_config("verbalized")
    budget = config.verbalized.max_new_tokens
    real = verbalized_speaker.generate_texts

    def stated(player, prompts, key, sampling):
        if sampling.max_new_tokens == budget:
            return [answer] * len(prompts)
        return real(player, prompts, key, sampling)

    monkeypatch.setattr(verbalized_speaker, "generate_texts", stated)
    config.rollout.update(groups=2, group_size=2)
    setup = build(config)
    episodes = rl_step.play_episodes(setup, setup.state, 0)
    metrics = rl_step.episode_stats(episodes)  # the step's metrics of its episodes
    replies = [m.text for e in episodes for m in e.messages[1:] if m.role == SIM]  # after the env's opening
    assert len(replies) == len(episodes) * config.env.max_turns and set(replies) <= set(CANDIDATES)
    records = [r for e in episodes for r in e.info["verbalized"]]
    assert len(records) == len(replies) and not any(r["fell_back"] for r in records)
    assert metrics["verbalized/turns"] == len(replies) and metrics["verbalized/fallback_rate"] == 0.0
    assert metrics["verbalized/deviation"] == pytest.approx(0.3)
