"""The evaluator's rules: T11 (COMMUNICATE), T12 (pass^k), ACTION matching, the termination gate, the
NL judge contract and what happens without a judge."""

import json
from math import comb

import pytest

from scope_jax.envs.tau2 import scripted
from scope_jax.envs.tau2.evaluator import action_matches, communicated, evaluate, pass_hat_k
from scope_jax.envs.tau2.judge import SYSTEM_PROMPT, JudgeError, parse_verdicts, user_prompt
from scope_jax.envs.tau2.tasks import Action
from scope_jax.envs.tau2.toolkit import ToolCall
from scope_jax.envs.tau2.trajectory import Turn
from tests.envs.tau2.conftest import play


def test_t11_communicate_rule():
    assert communicated("8276.23", [Turn("assistant", "Your refund is $8,276.23 in total.")])
    assert communicated("Refund", [Turn("assistant", "the REFUND went through")])
    assert not communicated("8276.23", [Turn("user", "$8,276.23")])  # only the agent's text counts
    assert not communicated("8,276.23", [Turn("assistant", "$8,276.23")])  # commas go from the text only
    call = ToolCall("calculate", {"expression": "1 + 1"})
    assert communicated("two items", [Turn("assistant", "You have two items.", (call,))])  # next to a call
    assert communicated("help you today", [Turn("assistant", "Hi! How can I help you today?")])  # greeting


def test_t12_pass_hat_k():
    trials = [[1.0, 1.0, 0.0, 0.0]]  # n = 4, c = 2
    assert [pass_hat_k(trials, k) for k in (1, 2, 3, 4)] == [0.5, 1 / 6, 0.0, 0.0]
    two_tasks = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert pass_hat_k(two_tasks, 2) == (comb(3, 2) / comb(3, 2) + 0.0) / 2
    assert pass_hat_k([[1.0 - 1e-7, 0.5]], 1) == 0.5  # success within 1e-6 of 1
    with pytest.raises(ValueError, match="at least 3 trials"):
        pass_hat_k(trials[:1] + [[1.0, 1.0]], 3)


def test_action_matching():
    gold = Action("a", ToolCall("get_order_details", {"order_id": "#W1"}))
    assert action_matches(gold, ToolCall("get_order_details", {"order_id": "#W1"}))
    assert not action_matches(gold, ToolCall("get_order_details", {"order_id": "#W2"}))
    assert not action_matches(gold, ToolCall("get_user_details", {"order_id": "#W1"}))
    assert action_matches(gold, ToolCall("get_order_details", {}))  # keys of the predicted call: none
    assert not action_matches(gold, ToolCall("get_order_details", {"order_id": "#W1", "x": 1}))
    anything = Action("t", ToolCall("transfer_to_human_agents", {"summary": "gold words"}), compare_args=())
    assert action_matches(anything, ToolCall("transfer_to_human_agents", {"summary": "other words"}))
    some = Action("s", ToolCall("f", {"a": 1, "b": 2}), compare_args=("a",))
    assert action_matches(some, ToolCall("f", {"a": 1, "b": 3}))
    assert not action_matches(some, ToolCall("f", {}))


def test_termination_gate(retail_env):
    task = retail_env.domain_data.tasks["10"]  # the null agent's win: DB unchanged, no NL assertion
    state = retail_env.domain_data.initial_state(task)
    gold = retail_env.gold_hashes(task)
    for reason, reward in (("user_stop", 1.0), ("agent_stop", 1.0), ("max_steps", 0.0),
                           ("too_many_errors", 0.0), ("agent_error", 0.0), ("context_limit", 0.0)):
        evaluation = evaluate(task, [], reason, state, gold)
        assert evaluation.reward == reward, reason
        assert evaluation.components["DB"] == 1.0  # computed for diagnosis either way


def test_judge_contract(retail_env):
    task = retail_env.domain_data.tasks["36"]  # a test-split task with NL assertions
    assertions = list(task.criteria.nl_assertions)
    seen = {}

    def judge(system, user):
        seen.update(system=system, user=user)
        return "```json\n" + json.dumps({"results": [
            {"expectedOutcome": a, "reasoning": "r", "metExpectation": True} for a in assertions]}) + "\n```"

    retail_env.judge = judge
    try:
        episode = play(retail_env, task, scripted.oracle_agent(task), scripted.scripted_user())
    finally:
        retail_env.judge = None
    assert episode.rewards["agent"] == 1.0 and episode.rewards["nl_judged"] == 1.0
    assert seen["system"] == SYSTEM_PROMPT
    for key in ("expectedOutcome", "reasoning", "metExpectation", "results"):
        assert key in SYSTEM_PROMPT
    lines = seen["user"].splitlines()
    assert lines[1] == "assistant: Hi! How can I help you today?"
    assert lines[2] == f"user: {scripted.USER_OPENING}"
    assert lines[3] == "assistant: None"  # a pure tool-call turn
    assert lines[4].startswith("tool: ")
    assert seen["user"].endswith(f"Expected outcomes:\n{assertions!r}")
    turns = episode.info["tau2"].turns
    assert seen["user"] == user_prompt(turns, assertions)


def test_judge_verdicts():
    reply = '{"results": [{"metExpectation": true}, {"metExpectation": false}]}'
    assert parse_verdicts(reply) == [True, False]
    assert parse_verdicts('Here: {"results": []} done') == []  # an empty list passes (all of none)
    huge = '{"results": [{"metExpectation": true, "n": ' + "1" * 4400 + "}]}"  # json.loads: ValueError
    for reply in ("no json", '{"result": []}', '{"results": [{"metExpectation": "yes"}]}', huge):
        with pytest.raises(JudgeError):
            parse_verdicts(reply)


def test_judge_failures_are_not_evaluated_and_counted(retail_env):
    task = retail_env.domain_data.tasks["36"]
    retail_env.judge = lambda system, user: "I think it went fine."
    try:
        episode = play(retail_env, task, scripted.oracle_agent(task), scripted.scripted_user())
    finally:
        retail_env.judge = None
    evaluation = episode.info["tau2_evaluation"]
    assert evaluation.not_evaluated == ("NL_ASSERTION",) and evaluation.scored == ("DB",)
    assert episode.rewards["judge_failures"] == 1.0 and episode.rewards["nl_not_evaluated"] == 1.0
    asked = []
    retail_env.judge = lambda system, user: asked.append(1) or '{"results": []}'
    try:
        stopped = play(retail_env, task, scripted.oracle_agent(task), lambda episode: "")
    finally:
        retail_env.judge = None
    assert stopped.end_reason == "user_error" and not asked  # no judge call for a failed episode
