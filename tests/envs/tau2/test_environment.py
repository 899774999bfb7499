"""Tau2Env's episode logic: T10 (termination), agent and user failures, who sees what and who speaks next,
the tool formats, prompts, scenarios and registration."""

import copy

import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs import ENVIRONMENTS
from scope_jax.envs.tau2 import Tau2Env
from scope_jax.envs.tau2.environment import GREETING
from scope_jax.envs.tau2.tool_calls import format_tool_call
from scope_jax.envs.tau2.toolkit import ToolCall
from tests.envs.tau2.conftest import DATA, play

LOOKUP = format_tool_call(ToolCall("get_order_details", {"order_id": "#W4862767"}))
BAD_LOOKUP = format_tool_call(ToolCall("get_order_details", {"order_id": "nope"}))
CANCEL = format_tool_call(ToolCall("cancel_pending_order", {"order_id": "#W4862767",
                                                            "reason": "no longer needed"}))


def lines(*texts: str):
    """A speaker that says `texts` in order, then repeats the last one."""
    queue = list(texts)
    return lambda episode: queue.pop(0) if len(queue) > 1 else queue[0]


def task(env, task_id="0"):
    return env.domain_data.tasks[task_id]


def test_t10_stop_token_inside_a_longer_message(retail_env):
    episode = play(retail_env, task(retail_env), lines("Hello, I have a question."),
                   lines("hi", "Great, thanks so much! ###STOP### Have a nice day."))
    assert episode.end_reason == "user_stop" and episode.rewards["ended_normally"] == 1.0
    for token in ("###TRANSFER###", "###OUT-OF-SCOPE###"):
        ended = play(retail_env, task(retail_env), lines("Hello."), lines("hi", f"ok {token}"))
        assert ended.end_reason == "user_stop"


def test_t10_stop_on_the_last_step_becomes_max_steps(make_env):
    env = make_env(max_steps=3)  # user (1), agent text (2), user stop (3)
    episode = play(env, task(env, "10"), lines("Hello."), lines("hi", "bye ###STOP###"))
    assert episode.end_reason == "max_steps" and episode.rewards["agent"] == 0.0
    longer = make_env(max_steps=4)
    episode = play(longer, task(longer, "10"), lines("Hello."), lines("hi", "bye ###STOP###"))
    assert episode.end_reason == "user_stop" and episode.rewards["agent"] == 1.0  # task 10: null agent wins


def test_t10_tenth_tool_error_ends_at_once(retail_env):
    episode = play(retail_env, task(retail_env), lines(BAD_LOOKUP), lines("hi"))
    assert episode.end_reason == "too_many_errors"
    assert episode.rewards["tool_errors"] == 10 and episode.rewards["tool_calls"] == 10
    assert sum(m.role == AGENT for m in episode.messages) == 1 + 10  # greeting, then 10 failing calls
    assert episode.messages[-1].role == ENV and episode.messages[-1].text == "Error: Order not found"


def test_t10_all_calls_of_a_message_run_before_the_error_limit(make_env):
    env = make_env(max_errors=2)
    episode = play(env, task(env), lines("\n".join([BAD_LOOKUP] * 3)), lines("hi"))
    assert episode.end_reason == "too_many_errors" and episode.rewards["tool_errors"] == 3


def test_t10_pending_tool_call_runs_before_max_steps(make_env):
    env = make_env(max_steps=2)  # user (1), agent call (2, pending), env (3)
    episode = play(env, task(env), lines(CANCEL), lines("hi"))
    assert episode.end_reason == "max_steps" and episode.rewards["steps"] == 3
    assert episode.messages[-1].role == ENV and '"status": "cancelled"' in episode.messages[-1].text
    assert episode.info["tau2"].state.agent.db.get("orders", "#W4862767")["status"] == "cancelled"


@pytest.mark.parametrize("text", ["", "   \n", "<tool_call>{not json</tool_call>",
                                  "<tool_call>\n{\"args\": 1}"])
def test_agent_message_without_text_or_call_is_an_agent_error(retail_env, text):
    episode = play(retail_env, task(retail_env, "10"), lines(text), lines("hi"))
    assert episode.end_reason == "agent_error"
    assert episode.rewards["agent"] == 0.0 and episode.rewards["agent_error"] == 1.0
    assert episode.rewards["parse_failures"] == float("<tool_call>" in text)


def test_unreadable_call_next_to_text_is_counted_and_the_text_goes_to_the_user(retail_env):
    episode = play(retail_env, task(retail_env, "10"),
                   lines("Let me check. <tool_call>{broken</tool_call>"), lines("hi", "###STOP###"))
    assert episode.end_reason == "user_stop" and episode.rewards["parse_failures"] == 1.0
    assert episode.messages[2].visible_to == (AGENT, SIM)


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_order_details", "arguments": {"order_id": ' + "1" * 4400 + "}}</tool_call>",
    '<tool_call>{"name": "get_order_details", "arguments": ' + "[" * 3000 + "]" * 3000 + "}</tool_call>",
    '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
    '{"name": "get_order_details", "arguments": "order #W4862767"}'],
    ids=["huge_int", "deep", "surrogate", "untagged"])
def test_unusable_agent_calls_are_counted_parse_failures(retail_env, text):
    episode = play(retail_env, task(retail_env, "10"), lines(text, "Done."), lines("hi", "###STOP###"))
    assert episode.rewards["parse_failures"] == 1.0 and episode.rewards["tool_calls"] == 0.0
    assert all(m.text.encode("utf-8") for m in episode.messages)  # no lone surrogate for a tokenizer


def test_unreadable_user_call_is_a_counted_parse_failure(mock_env):
    call = '<tool_call>{"name": "check_notifications", "arguments": {"x": ' + "1" * 4400 + "}}</tool_call>"
    episode = play(mock_env, task(mock_env, "update_task_with_user_tools"), lines("Hello."), lines(call))
    assert episode.end_reason == "user_error" and episode.rewards["parse_failures"] == 1.0


def test_empty_user_message_is_a_user_error(retail_env):
    episode = play(retail_env, task(retail_env), lines("Hello."), lines("  "))
    assert episode.end_reason == "user_error" and episode.rewards["agent"] == 0.0


def test_tool_traffic_is_the_agents_only_and_the_agent_speaks_again(retail_env):
    episode = Episode(task(retail_env), group=0)
    episode.messages.extend(retail_env.opening(episode.scenario))
    assert [(m.role, m.text, m.visible_to) for m in episode.messages] == [(AGENT, GREETING, (AGENT, SIM))]
    assert retail_env.first_speaker == SIM

    def say(role, text):
        message = Message(role, text)
        episode.messages.append(message)
        result = retail_env.after_turn(episode, message)
        episode.messages.extend(result.messages)
        return message, result

    _, result = say(SIM, "I want to check an order.")
    assert result.next_speaker == AGENT and not result.done and not result.messages
    message, result = say(AGENT, "Sure.\n" + LOOKUP + "\n" + BAD_LOOKUP)
    assert message.visible_to == (AGENT,) and result.next_speaker == AGENT
    assert [(m.role, m.visible_to) for m in result.messages] == [(ENV, (AGENT,))] * 2
    assert result.messages[0].text.startswith('{"order_id": "#W4862767"')
    assert result.messages[1].text == "Error: Order not found"
    _, result = say(AGENT, "Your order is pending.")
    assert result.next_speaker == SIM
    run = retail_env.episode_state(episode)
    assert (run.steps, run.tool_calls, run.errors) == (4, 2, 1)
    calls = [c for t in run.turns for c in t.tool_calls]
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert [t.role for t in run.turns] == ["assistant", "user", "assistant", "tool", "tool", "assistant"]
    assert run.turns[2].content == "Sure."  # the text next to tool calls, kept for COMMUNICATE


def test_text_tool_format(make_env):
    env = make_env(tool_format="text")
    prompt = env.system_prompt(task(env), AGENT)
    assert "<tools>" in prompt and '"name": "cancel_pending_order"' in prompt and "<tool_call>" in prompt
    episode = play(env, task(env), lines(LOOKUP, "Done."), lines("hi", "###STOP###"))
    result = [m for m in episode.messages if m.role == ENV][0]
    assert result.text.startswith("<tool_response>\n{") and result.text.endswith("}\n</tool_response>")
    template = make_env()
    assert "<tools>" not in template.system_prompt(task(template), AGENT)


def test_system_prompts(retail_env, mock_env):
    agent = retail_env.system_prompt(task(retail_env), AGENT)
    policy = (DATA / "domains" / "retail" / "policy.md").read_text()
    assert agent.startswith("<instructions>\n") and agent.endswith(f"<policy>\n{policy}\n</policy>")
    user = retail_env.system_prompt(task(retail_env, "20"), SIM)
    guidelines = (DATA / "user_simulator" / "simulation_guidelines.md").read_text()
    assert user.startswith(guidelines + "\n\n<scenario>\n") and user.endswith("\n</scenario>")
    assert "\tDomain: retail\n\tReason for call:\n\t\tYou just won a lottery" in user
    assert "\tKnown info:\n\t\tYou are Ethan Garcia, and you live in Denver, 80280." in user
    mock_user = mock_env.system_prompt(task(mock_env, "update_task_with_user_tools"), SIM)
    assert mock_user.startswith((DATA / "user_simulator" / "simulation_guidelines_tools.md").read_text())
    assert "Persona:\n\tProfessional and direct" in mock_user
    names = [s["function"]["name"] for s in mock_env.tool_schemas(SIM)]
    assert names == ["check_notifications", "dismiss_notification"]
    assert retail_env.tool_schemas(SIM) == []


def test_scenarios_come_from_the_splits(retail_env):
    rng = np.random.default_rng(0)
    test_ids = set(retail_env.domain_data.splits["test"])
    evaluation = retail_env.sample_scenarios(40, rng, split="eval")
    assert {t.id for t in evaluation} == test_ids  # distinct while the split lasts
    train = retail_env.sample_scenarios(100, rng, split="train")
    assert {t.id for t in train} <= set(retail_env.domain_data.splits["train"]) and len(train) == 100
    assert len(retail_env.sample_scenarios(3, rng, split="base")) == 3
    with pytest.raises(ValueError, match="no split 'dev'"):
        retail_env.sample_scenarios(1, rng, split="dev")


def test_registration_and_a_missing_data_folder(tmp_path):
    assert ENVIRONMENTS["tau2"] is Tau2Env
    with pytest.raises(ValueError, match="domain folder .* is missing"):
        Tau2Env(data_dir=str(tmp_path))


def test_bad_settings(make_env):
    with pytest.raises(ValueError, match="grading 'v2'"):
        make_env(grading="v2")
    with pytest.raises(ValueError, match="tool_format"):
        make_env(tool_format="xml")
    with pytest.raises(ValueError, match="no split 'train'"):
        make_env(domain="mock")


def test_episodes_copy_cheaply_and_independently(retail_env):
    episode = Episode(task(retail_env), group=0)
    episode.messages.extend(retail_env.opening(episode.scenario))
    retail_env.after_turn(episode, Message(SIM, "hi"))
    fork = copy.deepcopy(episode)
    retail_env.after_turn(fork, Message(AGENT, CANCEL))
    assert fork.info["tau2"].state.agent.db.get("orders", "#W4862767")["status"] == "cancelled"
    assert episode.info["tau2"].state.agent.db.get("orders", "#W4862767")["status"] == "pending"


def test_a_copied_episode_keeps_its_task_and_state(retail_env):
    """Forks deep-copy episodes (the collapse monitor's variance split): the copy still plays and scores."""
    episode = Episode(task(retail_env), group=0)
    episode.messages.extend(retail_env.opening(episode.scenario))
    fork = copy.deepcopy(episode)
    assert fork.scenario is episode.scenario
    message = Message(AGENT, LOOKUP)
    fork.messages.append(message)
    assert retail_env.after_turn(fork, message).messages  # the tool ran on the fork's own state
    fork.end_reason = "max_steps"
    assert retail_env.rewards(fork)["agent"] == 0.0 and retail_env.episode_state(episode).tool_calls == 0
