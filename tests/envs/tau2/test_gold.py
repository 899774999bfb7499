"""Gold replays and whole episodes through Tau2Env: T2 (every gold hash), T4 (the failing gold calls), T5
(the oracle agent scores 1 on every task), T6 (the null agent scores 1 on exactly six tasks), the
pre-1.0.0 grading, and the mock tasks. Episodes are played by scripted speakers through the
environment's own methods, through the engine's rollout."""

import ast

import pytest

from scope_jax.envs.tau2 import scripted
from scope_jax.envs.tau2.tasks import NL_ASSERTION
from scope_jax.envs.tau2.tool_calls import format_tool_call
from scope_jax.envs.tau2.toolkit import ToolCall
from tests.envs.tau2.conftest import REFERENCE, play

# Sheet section 6: the gold actions that fail on replay, per task (the retail data at HEAD).
FAILING_GOLD = {
    "2": ["Product not found"], "3": ["Product not found"], "4": ["Product not found"],
    "35": ["User not found"], "37": ["User not found"], "38": ["User not found"], "39": ["User not found"],
    "54": ["User not found"], "55": ["User not found"], "67": ["User not found", "User not found"],
    "68": ["User not found"], "46": ["Order not found", "Order not found"],
    "47": ["Order not found", "Order not found"], "64": ["Non-delivered order cannot be exchanged"],
    "105": ["Insufficient gift card balance to pay for the price difference"],
}
NULL_AGENT_WINS = {"10", "12", "25", "50", "57", "65"}


def judge_saying(met: bool):
    """A judge stub that finds every assertion met (or none)."""
    def judge(system: str, user: str) -> str:
        outcomes = user.rsplit("Expected outcomes:\n", 1)[1]
        count = len(ast.literal_eval(outcomes))  # the contract: the assertions as a Python list literal
        return '{"results": [' + ", ".join(
            f'{{"expectedOutcome": "o{i}", "reasoning": "stub", "metExpectation": {str(met).lower()}}}'
            for i in range(count)) + "]}"
    return judge


def test_t2_every_gold_hash(retail_env):
    domain = retail_env.domain_data
    hashes = {task_id: domain.gold_replay(task).state.hashes()[0] for task_id, task in domain.tasks.items()}
    assert {k: h[:10] for k, h in hashes.items()} == REFERENCE["retail_gold_prefixes"]
    assert sum(h == REFERENCE["retail_initial"] for h in hashes.values()) == 11


def test_t4_failing_gold_calls(retail_env):
    domain = retail_env.domain_data
    errors = {k: [e for _, e in domain.gold_replay(task).errors] for k, task in domain.tasks.items()}
    assert {k: [e.removeprefix("Error: ") for e in v] for k, v in errors.items() if v} == FAILING_GOLD


def _play_all(env, agent_for, judge=None):
    env.judge = judge
    try:
        return {task_id: play(env, task, agent_for(task), scripted.scripted_user())
                for task_id, task in env.domain_data.tasks.items()}
    finally:
        env.judge = None


def test_t5_oracle_agent_scores_one_everywhere(retail_env):
    episodes = _play_all(retail_env, scripted.oracle_agent, judge_saying(True))
    assert {k: e.rewards["agent"] for k, e in episodes.items()} == {k: 1.0 for k in episodes}
    assert all(e.end_reason == "user_stop" for e in episodes.values())
    judged = {k for k, e in episodes.items() if e.rewards["nl_judged"] and retail_env.domain_data.tasks[k]
              .criteria.nl_assertions}
    assert len(judged) == 40  # the tasks with NL assertions went to the judge


def test_t6_null_agent(retail_env):
    failing_judge = _play_all(retail_env, scripted.null_agent, judge_saying(False))
    assert {k for k, e in failing_judge.items() if e.rewards["agent"] == 1.0} == NULL_AGENT_WINS
    # without a judge, NL is reported as not evaluated instead of passing: the five DB-only wins say so
    unjudged = _play_all(retail_env, scripted.null_agent)
    wins = {k for k, e in unjudged.items() if e.rewards["agent"] == 1.0}
    flagged = {k for k in wins if unjudged[k].rewards["nl_not_evaluated"]}
    assert wins - flagged == NULL_AGENT_WINS
    assert flagged == {"24", "62", "67", "68", "105"}
    assert all(unjudged[k].info["tau2_evaluation"].not_evaluated == (NL_ASSERTION,) for k in flagged)
    assert all(unjudged[k].info["tau2_evaluation"].scored == ("DB",) for k in flagged)


def test_pre_1_0_grading_is_db_times_communicate(make_env):
    env = make_env(grading="db_communicate")
    oracle = _play_all(env, scripted.oracle_agent)
    assert all(e.rewards["agent"] == 1.0 for e in oracle.values())  # the oracle says every string
    assert all(e.info["tau2_evaluation"].basis == ("DB", "COMMUNICATE") for e in oracle.values())
    null = _play_all(env, scripted.null_agent)
    with_info = {k for k, t in env.domain_data.tasks.items() if t.criteria.communicate_info}
    assert {k for k, e in null.items() if e.rewards["agent"] == 1.0} == \
        {k for k, e in null.items() if e.rewards["db"] == 1.0} - with_info


def test_mock_tasks(mock_env):
    episodes = _play_all(mock_env, scripted.oracle_agent)
    rewards = {k: e.rewards["agent"] for k, e in episodes.items()}
    # no gold action to replay: the env assertion (task_2 completed) fails for the oracle
    assert rewards.pop("update_task_with_history_and_env_assertions") == 0.0
    # the data inconsistency of the sheet: the env assertion needs the user to dismiss notif_1, which the
    # gold (agent-only) user DB lacks, so the task fails either way
    assert rewards.pop("update_task_with_user_tools") == 0.0
    task = mock_env.domain_data.tasks["update_task_with_user_tools"]
    user = scripted.scripted_user(
        format_tool_call(ToolCall("check_notifications", {})), "Please mark task_1 as completed.",
        format_tool_call(ToolCall("dismiss_notification", {"notification_id": "notif_1"})))
    dismissed = play(mock_env, task, scripted.oracle_agent(task), user)
    assert dismissed.rewards["env_assertion"] == 1.0 and dismissed.rewards["db"] == 0.0
    assert dismissed.rewards["agent"] == 0.0
    assert rewards == {k: 1.0 for k in rewards} and len(rewards) == 8


def test_t13_mock_create_task(mock_env):
    task = mock_env.domain_data.tasks["create_task_1"]
    state = mock_env.domain_data.gold_replay(task).state
    assert state.agent.db.get("tasks", "task_2") == {"task_id": "task_2", "title": "Important Meeting",
                                                     "description": None, "status": "pending"}
    assert state.agent.db.get("users", "user_1")["tasks"] == ["task_1", "task_2"]

    def agent_with_description(call: ToolCall):
        lines = iter([format_tool_call(call), "Done."])
        return lambda episode: next(lines)

    empty = ToolCall("create_task", {"user_id": "user_1", "title": "Important Meeting", "description": ""})
    episode = play(mock_env, task, agent_with_description(empty), scripted.scripted_user())
    assert episode.rewards["db"] == 0.0 and episode.rewards["agent"] == 0.0


@pytest.mark.parametrize("task_id", ["update_task_with_message_history",
                                     "update_task_with_initialization_data",
                                     "update_task_with_initialization_actions"])
def test_mock_initial_states_make_task_2(mock_env, task_id):
    task = mock_env.domain_data.tasks[task_id]
    state = mock_env.domain_data.initial_state(task)
    assert state.agent.db.get("tasks", "task_2") == {
        "task_id": "task_2", "title": "Project Review", "description": "Review Q4 project status",
        "status": "pending"}
    assert state.agent.db.get("users", "user_1") == {"user_id": "user_1", "name": "Test User",
                                                     "tasks": ["task_1", "task_2"]}
