"""SFT data: a dialogue's view for SFT is the view the RL rollout grew (same tokens and mask in the batch),
written replies enter as tokens plus the stop token, and length buckets cover the data once per epoch."""

import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ROLES, SIM, Message
from scope_jax.models.tiny import word_tokenizer
from scope_jax.simulators.modes import sim_settings
from scope_jax.training.config import default_config
from scope_jax.training.rl_step import make_batch, play_episodes, role_advantages
from scope_jax.training.setup import build
from scope_jax.training.sft_data import Buckets, dialogue_view, teacher_forced, token_batch


@pytest.fixture(scope="module")
def rl_run():
    """A co-training setup on the target-word task (both roles train) and one step's played episodes."""
    config = default_config()
    config.sim.update(sim_settings("cotrain", model="tiny:1"))
    config.env.max_turns = 3
    config.rollout.update(groups=2, group_size=2)
    setup = build(config)
    episodes = play_episodes(setup, setup.state, step=0)
    return setup, episodes


@pytest.mark.parametrize("role", ROLES)
def test_sft_rows_equal_the_rl_batch_rows_of_the_same_dialogues(rl_run, role):
    setup, episodes = rl_run
    batch = make_batch(setup, episodes, role_advantages(setup, episodes), 0)
    rl_rows = batch.agent if role == AGENT else batch.sims
    player = setup.agent if role == AGENT else setup.mode.sim_player(setup.sims)
    views = [dialogue_view(setup.env, e, role, player.tokenizer) for e in episodes]
    sft = token_batch(views, player.sampling.pad_token_id)
    tokens, mask = (np.asarray(x).reshape(len(episodes), -1) for x in (rl_rows.tokens, rl_rows.loss_mask))
    assert sft.loss_mask.sum() > 0
    np.testing.assert_array_equal(sft.tokens, tokens)
    np.testing.assert_array_equal(sft.loss_mask, mask)


def test_a_written_reply_is_its_tokens_and_the_stop_token():
    tok = word_tokenizer(("say", "apple", "pear"))
    forced = teacher_forced(Message(SIM, "say pear"), tok)
    assert forced.sampled_ids == (*tok("say pear", add_special_tokens=False).input_ids, tok.eos_token_id)
    assert forced.stopped and len(forced.logprobs) == 3
    sampled = Message(SIM, "pear", sampled_ids=(5, 6), logprobs=(-1.0, -2.0))
    assert teacher_forced(sampled, tok) is sampled


def test_buckets_hold_similar_lengths_and_each_epoch_visits_every_bucket_once():
    lengths = np.random.default_rng(0).integers(10, 500, 23)
    buckets = Buckets.by_length(lengths, 4)
    assert buckets.dropped == 3 and len(buckets.buckets) == 5
    spans = [lengths[list(b)] for b in buckets.buckets]
    assert all(a.max() <= b.min() for a, b in zip(spans, spans[1:]))  # sorted by length
    for epoch in range(2):
        seen = [buckets.at_step(epoch * 5 + i, seed=3) for i in range(5)]
        assert sorted(seen) == sorted(buckets.buckets)
    assert [buckets.at_step(i, 3) for i in range(10)] == [buckets.at_step(i, 3) for i in range(10)]
    assert [buckets.at_step(i, 3) for i in range(5)] != [buckets.at_step(i, 4) for i in range(5)]
