"""The committed P4G table: recomputed from the data when it is there; the counting rules on a toy file."""

import csv
import json
import pathlib

import pytest

from scope_jax.envs import p4g_stats

DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "p4g"


def test_p4g_stats_match_data():
    if not (DATA / "AnnotatedData" / "300_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA}); the committed table cannot be checked against it")
    assert p4g_stats.compute_stats(DATA) == p4g_stats.load_stats()


def test_committed_table_is_consistent():
    stats = p4g_stats.load_stats()
    assert stats["strategies"] == list(p4g_stats.STRATEGIES)
    assert stats["user_acts"] == list(p4g_stats.USER_ACTS)
    assert len(stats["reply_counts"]) == len(p4g_stats.STRATEGIES)
    assert all(len(row) == len(p4g_stats.USER_ACTS) and min(row) > 0 for row in stats["reply_counts"])
    assert sum(len(labels) for labels in p4g_stats.USER_GROUPS.values()) == 23  # the P4G persuadee labels
    donation = stats["donation"]
    assert donation["count"] == 982
    assert donation["mean"] == pytest.approx(0.35, abs=0.005)
    assert donation["fraction_donating"] == pytest.approx(0.519, abs=5e-4)


def _write(path, header, rows):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture
def toy_data(tmp_path):
    (tmp_path / "AnnotatedData").mkdir()
    (tmp_path / "FullData").mkdir()
    header = ["", "B2", "B4", "Turn", "Unit", "er_label_1", "ee_label_1", "er_label_2", "ee_label_2"]
    header += ["neg", "neu", "pos"]
    rows = [
        # dialogue a: a persuader turn of two sentences (credibility, then a variant spelling of task inquiry
        # as second label), a two-sentence reply; then a donation request answered by agreement
        (0, "a", 0, 0, "x", "Credibility appeal", "", "non-personal-Task-related-inquiry", ""),
        (1, "a", 0, 0, "x", "greeting", "", "", ""),
        (2, "a", 1, 0, "x", "", "ask-org-info", "", "thank"),
        (3, "a", 1, 0, "x", "", "positive-to-inquiry", "", ""),
        (4, "a", 0, 1, "x", "proposition-of-donation", "", "", ""),
        (5, "a", 1, 1, "x", "", "agree-donation", "", ""),
        # dialogue b: the `Turn` column is out of order (the row order counts); the last turn has no reply
        (6, "b", 0, 3, "x", "credibility-appeal", "", "", ""),
        (7, "b", 1, 2, "x", "", "negative-reaction-to-donation", "", ""),
        (8, "b", 0, 4, "x", "emotion-appeal", "", "", ""),
    ]
    _write(tmp_path / "AnnotatedData" / "300_dialog.csv", header, [r + (0, 1, 0) for r in rows])
    _write(
        tmp_path / "FullData" / "full_info.csv",
        ["B2", "B3", "B4", "B6"],
        [
            ("a", "u1", 0, "0.0"),  # a persuader: not counted
            ("a", "u2", 1, "1.0"),
            ("b", "u3", 1, "0.0"),
            ("c", "u4", 1, "100.0"),  # outside [0, 2]
            ("d", "u5", 1, ""),
        ],
    )
    return tmp_path


def test_counting_rules_on_a_toy_file(toy_data, capsys):
    stats = p4g_stats.compute_stats(toy_data)
    strategy = {s: i for i, s in enumerate(p4g_stats.STRATEGIES)}
    user = {u: i for i, u in enumerate(p4g_stats.USER_ACTS)}
    turns = [0] * len(p4g_stats.STRATEGIES)
    turns[strategy["credibility-appeal"]] = 2
    turns[strategy["task-related-inquiry"]] = 1
    turns[strategy["emotion-appeal"]] = 1
    assert stats["dialogues"] == 2
    assert stats["strategy_turns"] == turns
    assert stats["donation_request_turns"] == 1
    counts = stats["reply_counts"]
    expected_credibility = [0] * 5
    expected_credibility[user["ask_info"]] = 1
    expected_credibility[user["neutral"]] = 1  # thank
    expected_credibility[user["share_personal"]] = 1
    expected_credibility[user["negative"]] = 1  # dialogue b
    assert counts[strategy["credibility-appeal"]] == expected_credibility
    assert sum(counts[strategy["task-related-inquiry"]]) == 3
    assert sum(counts[strategy["emotion-appeal"]]) == 0  # no reply followed
    assert stats["donation"] == {"count": 2, "mean": 0.5, "fraction_donating": 0.5}
    p4g_stats.main(["--data", str(toy_data)])
    assert json.loads(capsys.readouterr().out) == stats


def test_unknown_persuadee_label_raises(toy_data):
    path = toy_data / "AnnotatedData" / "300_dialog.csv"
    path.write_text(path.read_text().replace("agree-donation", "agree-to-everything"))
    with pytest.raises(ValueError, match="agree-to-everything"):
        p4g_stats.compute_stats(toy_data)
