"""The P4G RL arms' summary: outcomes counted by hand, the committed table equal to its artifact and judged by
the committed judge."""

import json
import math

import pytest

from experiments import p4g_rl_arms
from scope_jax.models import lora


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


def test_the_committed_arms_were_judged_by_the_committed_judge():
    results = json.loads((p4g_rl_arms.RESULTS / "arms.json").read_text())
    committed = lora.adapter_sha256(p4g_rl_arms.JUDGE)
    assert {arm["judge_adapter_sha256"] for arm in results.values()} == {committed}
    p4g_rl_arms.check_judge(results, committed)
    with pytest.raises(SystemExit, match="not the committed judge's"):
        p4g_rl_arms.check_judge(results, "0" * 64)
