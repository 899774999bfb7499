"""The human P4G dialogues as environment episodes: turns merged and capped as the environment caps them,
the closing answer reads back as the participant's real donation, and the split is the environment's."""

import csv

import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ENV, SIM
from scope_jax.envs import p4g
from scope_jax.envs.p4g_donations import extract_answer, extract_donation
from scope_jax.envs.p4g_human import DIALOG_FILE, HumanDialogues, closing_answer, load_turns

from .test_p4g import DATA, _row, write_info


def write_dialogs(folder, rows):
    path = folder / DIALOG_FILE
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["", "Unit", "Turn", "B4", "B2"])
        writer.writerows([i, text, 0, role, dialogue] for i, (dialogue, role, text) in enumerate(rows))


@pytest.fixture
def toy(tmp_path):
    write_info(tmp_path, [_row("a", B2="d1", B6="0.25"), _row("b", B2="d2", B6=""), _row("c", B2="d9")])
    write_dialogs(tmp_path, [("d1", "0", "Hi."), ("d1", "0", "Would you donate?"), ("d1", "1", "Maybe."),
                             ("d1", "0", "Please."), ("d1", "1", "OK, $1."), ("d1", "0", "Thanks!"),
                             ("d2", "1", "Hello")])
    return p4g.P4GEnv(data_dir=str(tmp_path), heldout_fraction=0.0)


def test_turns_are_runs_of_one_speaker(toy):
    turns = load_turns(toy.data_dir)
    assert turns["d1"] == [(AGENT, "Hi. Would you donate?"), (SIM, "Maybe."), (AGENT, "Please."),
                           (SIM, "OK, $1."), (AGENT, "Thanks!")]


@pytest.mark.parametrize("max_turns,said", [(1, ["Hi. Would you donate?", "Maybe."]),
                                            (2, ["Hi. Would you donate?", "Maybe.", "Please.", "OK, $1."])])
def test_episode_is_the_opening_capped_turns_and_the_real_donation(toy, max_turns, said):
    dialogues = HumanDialogues.load(toy, "train", max_turns)
    assert dialogues.skipped == {"no_donation": 1, "no_dialogue": 1}
    (episode,) = dialogues.episodes
    messages = episode.messages
    assert messages[0] == toy.opening(episode.scenario)[0]
    assert [m.text for m in messages[1:-2]] == said
    assert [m.role for m in messages[1:-2]] == [AGENT, SIM] * max_turns
    closing = messages[-2]
    assert (closing.role, closing.text, closing.visible_to) == (ENV, p4g.CLOSING_QUESTION, (SIM,))
    assert messages[-1].role == SIM and p4g.stated_donation(episode) == 0.25  # the closing answer wins


def test_missing_dialog_file_and_unknown_split_are_one_line_errors(tmp_path):
    write_info(tmp_path, [_row("a")])
    env = p4g.P4GEnv(data_dir=str(tmp_path))
    with pytest.raises(p4g.P4GDataError, match=r"full_dialog.csv is missing$"):
        HumanDialogues.load(env, "train", 2)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        HumanDialogues.load(env, "test", 2)


@pytest.fixture(scope="module")
def real_env():
    if not (DATA / DIALOG_FILE).exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    return p4g.P4GEnv(data_dir=str(DATA))


def test_every_real_closing_answer_reads_back_as_b6(real_env):
    episodes = [e for split in ("train", "eval") for e in HumanDialogues.load(real_env, split, 10).episodes]
    assert len(episodes) == 982  # every valid donation (docs/p4g.md: 982 of 1,017 rows)
    for episode in episodes:
        answer = episode.messages[-1].text
        assert extract_donation(answer) == extract_answer(answer) == episode.scenario.donation, answer
        assert p4g.stated_donation(episode) == episode.scenario.donation
    assert closing_answer(0.05) == "I donate $0.05."


def test_train_split_is_the_participants_the_environment_does_not_hold_out(real_env):
    train = {e.scenario.participant for e in HumanDialogues.load(real_env, "train", 10).episodes}
    held_out = {e.scenario.participant for e in HumanDialogues.load(real_env, "eval", 10).episodes}
    assert not train & held_out
    scores = np.array([p4g.heldout_score(p, real_env.split_seed) for p in train])
    assert scores.min() >= real_env.heldout_fraction
    assert (len(train), len(held_out)) == (597, 150)  # regression pin (measured): the committed hash split


def test_judge_and_simulator_splits_cut_the_train_participants_by_a_second_hash(real_env):
    people = {split: {p.participant for p in real_env.splits[split]} for split in real_env.splits}
    assert people["judge"] | people["simulator"] == people["train"]
    assert not people["judge"] & people["simulator"] and not people["train"] & people["eval"]
    score = lambda p: p4g.judge_score(p, real_env.split_seed)
    assert all(score(p) < real_env.judge_fraction for p in people["judge"])
    assert all(score(p) >= real_env.judge_fraction for p in people["simulator"])
    assert (len(people["judge"]), len(people["simulator"])) == (335, 275)  # regression pin (measured)
    env = p4g.P4GEnv(data_dir=str(DATA), train_split="simulator")  # what p4g_rl trains the agent on
    drawn = env.sample_scenarios(64, np.random.default_rng(0), split="train")
    assert {p.participant for p in drawn} <= people["simulator"]
    with pytest.raises(ValueError, match="train_split is 'judge'"):
        p4g.P4GEnv(data_dir=str(DATA), train_split="judge")
