"""ModelJudge: a local model (here a tiny random HF folder) answers the judge's prompts under its chat
template, greedily; a prompt beyond its context is a JudgeError; `judge_model` names it in the config."""

import pytest

from scope_jax.envs.tau2.judge import JudgeError, ModelJudge
from scope_jax.models import init, save_pretrained
from scope_jax.models.tiny import tiny_config, word_tokenizer

WORDS = ("true", "false", "grade", "met")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = word_tokenizer(WORDS)
    config = tiny_config(len(tok))
    _, params = init(config, seed=0)
    path = tmp_path_factory.mktemp("judge")
    save_pretrained(params, config, tok, path)
    return str(path)


def test_greedy_reply_and_context_limit(folder):
    judge = ModelJudge(folder, max_new_tokens=4, max_context=40)
    reply = judge("grade", "met true")
    assert reply == judge("grade", "met true")  # greedy: the same reply again
    assert 0 < len(reply.split()) <= 4 and set(reply.split()) <= set(WORDS) | {"system", "user", "assistant"}
    with pytest.raises(JudgeError, match="do not fit its context of 40 tokens"):
        judge("grade", " ".join(["met"] * 40))


def test_judge_model_setting(make_env, folder):
    env = make_env(judge_model=folder)
    assert isinstance(env.judge, ModelJudge) and env.judge.spec == folder
    given = lambda system, user: "{}"
    assert make_env(judge_model=folder, judge=given).judge is given
    assert make_env().judge is None


def test_a_judge_model_that_does_not_exist_is_refused_when_the_environment_is_made(make_env):
    """Not after the rollouts, where the judge is first asked (it loads on first use)."""
    with pytest.raises(FileNotFoundError, match="^'/nonexistent/model' is neither an HF folder"):
        make_env(judge_model="/nonexistent/model")
