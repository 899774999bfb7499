"""The P4G RL arms' summary: outcomes counted by hand, and the committed table equal to its artifact."""

import json
import math

import pytest

from experiments import p4g_rl_arms


def test_outcomes_count_unreadable_apart_from_the_donations():
    rewards = [{"agent": 1.0, "unreadable": 0.0, "donation": 0.5},
               {"agent": 0.0, "unreadable": 1.0, "donation": math.nan},
               {"agent": 0.0, "unreadable": 0.0, "donation": 0.0}]
    got = p4g_rl_arms.outcomes(rewards)
    assert got == {"dialogues": 3, "reward": pytest.approx(1 / 3), "unreadable": pytest.approx(1 / 3),
                   "donating": 0.5, "donation": 0.25}


def test_the_committed_table_is_its_artifact():
    results = json.loads((p4g_rl_arms.RESULTS / "arms.json").read_text())
    assert set(results) <= set(p4g_rl_arms.ARMS) and results
    assert (p4g_rl_arms.RESULTS / "arms.md").read_text() == p4g_rl_arms.table(results)
