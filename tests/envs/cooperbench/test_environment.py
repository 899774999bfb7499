"""The environment: gold and empty agents through its methods, views, scheduling, tool errors, modes."""

import os
import pathlib

import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs import make
from scope_jax.envs.cooperbench.environment import RECORD, CooperBenchEnv
from scope_jax.dialogue.rollout import rollout_scripted
from scope_jax.envs.cooperbench.scripted import SPEAKERS
from scope_jax.envs.cooperbench.tools import format_call
from tests.envs.cooperbench.conftest import TASK


@pytest.fixture(scope="module")
def env():
    env = make("cooperbench", isolation="process", max_turns=4)
    yield env
    env.close()


def _pair(env):
    return next(p for p in env.pairs if p.task.name == TASK)


def _play(env, agent):
    replies = {role: SPEAKERS[agent](env, role) for role in env.roles}
    return rollout_scripted(env, [Episode(_pair(env), 0)], replies)[0]


def test_gold_agents_score_one(env):
    episode = _play(env, "gold")
    assert episode.end_reason == "finished"
    assert {k: episode.rewards[k] for k in ("agent", "sim", "success", "feature_a_pass", "feature_b_pass",
                                            "naive_conflict", "merge_failed", "messages_sent")} == {
        "agent": 1.0, "sim": 1.0, "success": 1.0, "feature_a_pass": 1.0, "feature_b_pass": 1.0,
        "naive_conflict": 1.0, "merge_failed": 0.0, "messages_sent": 2.0}
    record = episode.info[RECORD]
    assert record["merge"]["status"] == "union" and "def sort" in record["patches"][AGENT]
    for result in record["features"]:  # the gold run's count per outcome, measured apart
        assert result["counts"] == result["expected"] == env.evaluator.gold(_pair(env).task,
                                                                            result["feature"]).counts
        assert result["counts"]["passed"] > 0 and result["canaries"] > 0
    assert not list(env.repos.root.glob("worktrees/*"))  # removed once the episode is scored


def test_a_nested_repository_written_past_the_tools_scores_zero_and_is_counted(env):
    episode = Episode(_pair(env), 0)
    _turn(env, episode, AGENT, format_call("finish"))  # makes the seats' worktrees
    worktree = episode.info["cooperbench_session"][AGENT].worktree
    for path in ("sub/.git/HEAD", "sub/.git/objects/info/x", "sub/.git/refs/x", "sub/a.py"):
        (worktree / path).parent.mkdir(parents=True, exist_ok=True)
        (worktree / path).write_text("ref: refs/heads/main\n" if path.endswith("HEAD") else "x = 1\n")
    before = env.git_errors
    rewards = env.rewards(episode)
    assert (rewards[AGENT], rewards["git_error"], env.git_errors) == (0.0, 1.0, before + 1)
    reasons = [f["reason"] for f in episode.info[RECORD]["features"]]
    assert all(r.startswith("the changes cannot be read: git add -A") and "\n" not in r for r in reasons)
    assert not list(env.repos.root.glob("worktrees/*"))


def test_empty_agents_score_zero(env):
    episode = _play(env, "empty")
    assert (episode.rewards["agent"], episode.rewards["partial"], episode.rewards["steps"]) == (0.0, 0.0, 2.0)
    assert episode.info[RECORD]["merge"]["status"] == "empty"


def test_solo_gold_agent_scores_one():
    env = CooperBenchEnv(mode="solo", isolation="process", exact_count=False)
    try:
        assert env.roles == (AGENT,) and "send_message" not in env.tool_names
        assert env.system_prompt(_pair(env), SIM) == ""
        prompt = env.system_prompt(_pair(env), AGENT)
        assert "Feature 1:" in prompt and "Feature 2:" in prompt
        episode = _play(env, "gold")
        assert episode.rewards["success"] == 1.0 and episode.rewards["steps"] == 2.0
        assert [m.role for m in episode.messages if m.role != ENV] == [AGENT, AGENT]
    finally:
        env.close()


def _turn(env, episode, role, text):
    message = Message(role, text)
    episode.messages.append(message)
    result = env.after_turn(episode, message)
    episode.messages.extend(result.messages)
    return result


def _view(episode, role):
    return [m.text for m in episode.messages if role in m.visible_to]


def test_private_worktrees_messages_and_scheduling(env):
    pair = _pair(env)
    episode = Episode(pair, 0)
    episode.messages.extend(env.opening(pair))
    prompt = env.system_prompt(pair, AGENT)
    assert "Your feature:" in prompt and pair.task.feature(1).spec in prompt
    assert pair.task.feature(2).spec not in prompt
    write = format_call("write_file", path="linetools/mine.py", content="SECRET = 1\n")
    assert _turn(env, episode, AGENT, write).next_speaker == SIM
    result = _turn(env, episode, SIM, format_call("read_file", path="linetools/mine.py"))
    assert result.next_speaker == AGENT and "no file" in result.messages[0].text
    result = _turn(env, episode, AGENT, format_call("send_message", text="I edit the end; [Message from x]"))
    assert [m.visible_to for m in result.messages] == [(AGENT,), (SIM,)]
    assert result.messages[1].text == "[Message from your partner]: I edit the end; (Message from x]"
    assert not any("SECRET" in text for text in _view(episode, SIM))  # the agent's turns are its own
    assert any("Message from your partner" in text for text in _view(episode, SIM))
    assert _turn(env, episode, SIM, format_call("finish")).next_speaker == AGENT
    assert _turn(env, episode, AGENT, format_call("list_files")).next_speaker == AGENT  # sim has stopped
    idle = _turn(env, episode, SIM, format_call("list_files"))
    assert idle.messages == [] and episode.info["cooperbench_session"][SIM].idle_turns == 1
    end = _turn(env, episode, AGENT, format_call("list_files"))  # the agent's 4th turn: its cap
    assert (end.done, end.reason) == (True, "turn_limit")


def test_tool_errors_are_answered_and_counted():
    env = CooperBenchEnv(isolation="process", max_messages=1, max_message_chars=20)
    try:
        episode = Episode(_pair(env), 0)
        calls = ["I am thinking.", '{"tool": "bash", "command": "ls"}', '{"tool": "read_file"}',
                 format_call("read_file", path="../../etc/passwd"),
                 format_call("send_message", text="x" * 21),
                 format_call("send_message", text="hi"), format_call("send_message", text="again")]
        answers = [_turn(env, episode, AGENT, call).messages[0].text for call in calls]
        assert all(a.startswith("error: ") for i, a in enumerate(answers) if i != 5), answers
        assert answers[5] == "message sent" and "most messages allowed (1)" in answers[6]
        seat = episode.info["cooperbench_session"][AGENT]
        assert seat.errors == {"no_call": 1, "unknown_tool": 1, "bad_arguments": 1, "refused": 3}
        assert seat.messages_sent == 1
    finally:
        env.close()


def test_a_file_name_that_is_not_utf8_written_past_the_tools_is_counted_and_scores_zero(env):
    episode = Episode(_pair(env), 0)
    _turn(env, episode, AGENT, format_call("list_files"))  # makes the seats' worktrees
    worktree = episode.info["cooperbench_session"][AGENT].worktree
    pathlib.Path(os.fsdecode(os.fsencode(worktree) + b"/\xff.py")).write_text("x = 1\n")
    answer = _turn(env, episode, AGENT, format_call("run_tests")).messages[0].text
    assert answer.startswith("error: ") and "not UTF-8" in answer
    assert episode.info["cooperbench_session"][AGENT].errors == {"refused": 1}
    before = env.git_errors
    rewards = env.rewards(episode)
    assert (rewards[AGENT], rewards["git_error"], env.git_errors) == (0.0, 1.0, before + 1)
    assert not worktree.exists()


def test_no_answer_or_message_carries_a_lone_surrogate(env):
    episode = Episode(_pair(env), 0)  # JSON escapes make lone surrogates, which the tokenizer cannot encode
    calls = [format_call("send_message", text="hi \ud800"), format_call("finish", **{"\udcff": 1}),
             format_call("write_file", path="\udcff.py", content="x"),
             format_call("write_file", path="x.py", content="\ud800")]
    answers = [_turn(env, episode, AGENT, call).messages[0].text for call in calls]
    assert answers[0] == "message sent" and all(a.startswith("error: ") for a in answers[1:]), answers
    assert episode.info["cooperbench_session"][AGENT].errors == {"bad_arguments": 1, "refused": 2}
    assert "[Message from your partner]: hi ?" in _view(episode, SIM)
    for message in episode.messages:
        message.text.encode("utf-8")


def test_messaging_can_be_switched_off():
    env = CooperBenchEnv(isolation="process", messaging=False)
    try:
        episode = Episode(_pair(env), 0)
        assert "send_message" not in env.system_prompt(_pair(env), AGENT)
        answer = _turn(env, episode, AGENT, format_call("send_message", text="hi")).messages[0].text
        assert "not available" in answer and episode.info["cooperbench_session"][AGENT].errors == {
            "unknown_tool": 1}
    finally:
        env.close()


def test_visible_tests_run_on_the_checkout_only(env):
    episode = Episode(_pair(env), 0)
    answer = _turn(env, episode, AGENT, format_call("run_tests")).messages[0].text
    assert answer.startswith("visible tests passed: 3 passed\n")  # the base's tests, no hidden ones


def test_scenarios_and_bad_settings(env):
    scenarios = env.sample_scenarios(5, np.random.default_rng(0))
    assert len(scenarios) == 5 and all(s in env.pairs for s in scenarios)
    with pytest.raises(ValueError, match="split 'test' is unknown"):
        env.sample_scenarios(1, np.random.default_rng(0), "test")
    with pytest.raises(ValueError, match="mode 'duo' is unknown"):
        CooperBenchEnv(mode="duo")
