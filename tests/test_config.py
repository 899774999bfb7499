"""Config validation and the runner's one-line errors."""

import contextlib
import pathlib
import re
import subprocess
import sys

import ml_collections
import pytest
from absl import flags

from experiments import run as runner
from experiments.run import prepare
from scope_jax.config import (FINITE, FINITE_AT_LEAST_0, FINITE_POSITIVE, FRACTION, PROBABILITY, ConfigError,
                              at_least, one_of, require, validate)
from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import SIM, Message
from scope_jax.envs.target_word import TargetWordEnv
from scope_jax.training import train
from scope_jax.training.run_dir import RunDir, RunDirError
from tests.training.conftest import tensorboard_scalars

ROOT = pathlib.Path(__file__).resolve().parents[1]


SCHEMA = {"experiment": "x", "seed": 0, "lr": 1e-3, "name": "a", "flag": False, "sizes": (1, 2),
          "maybe": None, "train": {"steps": 3, "inner": {"beta": 0.5}}}


def schema():
    return ml_collections.ConfigDict(SCHEMA)


def edited(**changes):
    """A config built from a dict (as a JSON or hand-written config would be), with top-level changes."""
    return ml_collections.ConfigDict({**SCHEMA, **changes})


@pytest.mark.parametrize("config,message", [
    (edited(train={"stpes": 4}), "unknown config key 'train.stpes'"),
    (edited(train={"steps": 3, "inner": {"beta": 0.5, "gamma": 1.0}}),
     "unknown config key 'train.inner.gamma'"),
    (edited(lr="fast"), "config key 'lr' must be of type float, got str 'fast'"),
    (edited(seed=1.5), "config key 'seed' must be of type int"),
    (edited(flag=1), "config key 'flag' must be of type bool"),
    (edited(name=3), "config key 'name' must be of type str"),
    (edited(train=5), "config key 'train' must be a group of settings"),
])
def test_bad_keys_and_types_are_named(config, message):
    with pytest.raises(ConfigError) as error:
        validate(config, schema())
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_compatible_values_pass():
    config = schema()
    config.lr = 1  # an int where a float is expected is fine
    config.sizes = [3]
    config.maybe = "anything"
    validate(config, schema())


@pytest.mark.parametrize("value, rule, refused", [
    (1, at_least(1), False), (0, at_least(1), True), (float("nan"), at_least(1), True),
    (0.0, FINITE_AT_LEAST_0, False), (-1e-9, FINITE_AT_LEAST_0, True),
    (float("inf"), FINITE_AT_LEAST_0, True),
    (-1.0, FINITE, False), (float("-inf"), FINITE, True),
    (1e-9, FINITE_POSITIVE, False), (0.0, FINITE_POSITIVE, True), (float("nan"), FINITE_POSITIVE, True),
    (0.0, FRACTION, False), (1.0, FRACTION, True), (float("nan"), FRACTION, True),
    (1.0, PROBABILITY, False), (0.0, PROBABILITY, True), ("sgd", one_of(["adamw", "sgd"]), False),
    ("adam", one_of(["adamw", "sgd"]), True),
])
def test_a_rule_refuses_exactly_the_values_outside_it(value, rule, refused):
    config = ml_collections.ConfigDict({"train": {"value": value}})
    if not refused:
        require(config, {"train.value": rule})
        return
    expected = f"^config key 'train.value' is .*; it must be {re.escape(rule.what)}$"
    with pytest.raises(ConfigError, match=expected):
        require(config, {"train.value": rule})


def test_unknown_experiment_is_refused():
    config = ml_collections.ConfigDict({"experiment": "nope"})
    with pytest.raises(ConfigError, match="known experiments"):
        prepare(config)


def run(*args):
    result = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    return result.returncode, result.stderr.strip().splitlines()


@pytest.mark.parametrize("override,expected", [
    ("--config.train.stpes=3", "error: unknown config key 'train.stpes'"),
    ("--config.sim.mode=nonsense", "error: config key 'sim.mode' is 'nonsense'"),
    ("--config.optimizer.learning_rate=fast", "error: flag --config.optimizer.learning_rate=fast: could not "
                                              "convert string to float: 'fast'"),
])
def test_runner_stops_with_one_line_naming_the_key(tmp_path, override, expected):
    code, lines = run("--config=experiments/configs/target_word.py", f"--workdir={tmp_path / 'run'}",
                      override)
    assert code != 0
    assert lines[-1].startswith(expected), lines
    assert not (tmp_path / "run").exists()


@contextlib.contextmanager
def runner_argv(monkeypatch, *args: str):
    """The runner's argv (`run ARGS`, from the repository root), its parsed flags reset afterwards."""
    monkeypatch.chdir(ROOT)
    argv = ["run", *args]
    monkeypatch.setattr(sys, "argv", argv)  # the config flag defines its override flags from sys.argv
    try:
        yield argv
    finally:
        flags.FLAGS.unparse_flags()
        for name in [name for name in flags.FLAGS if name.startswith("config.")]:
            delattr(flags.FLAGS, name)


def cli(monkeypatch, *args: str) -> str:
    """`python -m experiments.run ARGS` (its flag parsing and main()) in this process, so that a test can
    break a run on purpose; returns the message it exits with (exit status 1, the message on stderr)."""
    with runner_argv(monkeypatch, *args) as argv, pytest.raises(SystemExit) as stopped:
        runner.main(runner.parse_flags(argv))
    return stopped.value.code


@pytest.mark.parametrize("override, chunk_size", [((), None), (("--config.train.chunk_size=64",), 64)],
                         ids=["default", "flag"])
def test_the_sft_head_chunk_defaults_to_none_and_a_flag_overrides_it(monkeypatch, override, chunk_size):
    with runner_argv(monkeypatch, "--config=experiments/configs/sft.py:quick", *override) as argv:
        runner.parse_flags(argv)
        assert runner._CONFIG.value.train.chunk_size == chunk_size


TINY_RUN = ("--config=experiments/configs/target_word.py", "--config.train.steps=1",
            "--config.rollout.groups=1", "--config.rollout.group_size=2", "--config.train.eval_every=0")


@pytest.mark.parametrize("args,expected", [
    (["--config=experiments/configs/nowhere.py"],
     "error: config file experiments/configs/nowhere.py does not exist"),
    (["--config=experiments/configs/target_word.py:bogus"],
     "error: unknown simulator mode 'bogus'; one of frozen"),
    (["--config=experiments/configs/collapse.py", "--config.seeds=abc"],
     "error: config key 'seeds' must be of type tuple of int, got tuple ('abc',)"),
], ids=["missing config file", "unknown :ARG", "wrong-typed value"])
def test_a_users_mistake_is_one_line(tmp_path, monkeypatch, args, expected):
    message = cli(monkeypatch, *args, f"--workdir={tmp_path / 'run'}")
    assert message.startswith(expected) and "\n" not in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("body, expected", [
    ('def get_config():\n    raise RuntimeError("no such sweep")\n', "error: no such sweep"),
    ("settings = {}\n", "error: module 'config_config' has no attribute 'get_config'"),
], ids=["raises", "no get_config"])
def test_a_config_file_that_fails_to_load_is_one_line(tmp_path, monkeypatch, body, expected):
    # ml_collections loads every config file as the module config_config, into an old one if it exists
    monkeypatch.delitem(sys.modules, "config_config", raising=False)
    config = tmp_path / "broken.py"
    config.write_text(body)
    message = cli(monkeypatch, f"--config={config}", f"--workdir={tmp_path / 'run'}")
    assert message == expected


def test_a_run_stopped_on_purpose_is_one_line(tmp_path, monkeypatch):
    """TrainingStopped (too many non-finite steps) ends the command with its one-line message."""
    monkeypatch.setattr(train, "rl_step", lambda setup, state, step: (state, {"skipped": 1.0}, []))
    message = cli(monkeypatch, *TINY_RUN, f"--workdir={tmp_path}", "--config.train.max_consecutive_skips=0")
    assert message.startswith("error: 1 non-finite steps in a row at step 0") and "\n" not in message


def test_a_run_builds_its_environment_once_before_step_0(tmp_path, monkeypatch):
    """The command checks the config and builds the environment in one place and hands it down (to the
    setup, the evaluation, the monitor): by step 0, TargetWordEnv was constructed exactly once."""
    built, at_step_0 = [], []  # every TargetWordEnv constructed; (those built by step 0, the run's own)
    construct = TargetWordEnv.__init__
    monkeypatch.setattr(TargetWordEnv, "__init__", lambda self, *a, **k: (built.append(self),
                                                                          construct(self, *a, **k))[1])

    def first_step(setup, state, step):
        at_step_0.append((list(built), setup.env))
        return state, {"skipped": 1.0}, []  # stops the run here (max_consecutive_skips=0)

    monkeypatch.setattr(train, "rl_step", first_step)
    message = cli(monkeypatch, *TINY_RUN, f"--workdir={tmp_path}", "--config.train.max_consecutive_skips=0")
    assert message.startswith("error: 1 non-finite steps in a row at step 0"), message
    (before, used), = at_step_0
    assert len(before) == 1 and before[0] is used, before


def test_a_failed_prefix_check_is_one_line(tmp_path, monkeypatch):
    """An environment that rewrites a message a role already saw: the role's view refuses it, in one line."""
    def rewrite(self, episode, message):
        episode.messages[0] = Message(SIM, "say cherry please")
        return TurnResult()

    monkeypatch.setattr(TargetWordEnv, "after_turn", rewrite)
    message = cli(monkeypatch, *TINY_RUN, f"--workdir={tmp_path}")
    assert message.startswith("error: the dialogue the ") and "already saw changed" in message
    assert "\n" not in message


def test_run_dir_refuses_a_finished_run_and_truncates_resumed_metrics(tmp_path):
    config = {"a": 1}
    with RunDir.create(tmp_path, config) as run_dir:
        for step in range(5):
            run_dir.log(step, {"x": float(step)})
        run_dir.keep_metrics(lambda record: record["step"] < 3)
        assert [r["step"] for r in run_dir.read_metrics()] == [0, 1, 2]
        run_dir.close()
        assert tensorboard_scalars(tmp_path / "tensorboard") == [("x", 0), ("x", 1), ("x", 2)]
        for step in (3, 4):  # the resumed run logs them again: once each
            run_dir.log(step, {"x": float(step)})
        run_dir.close()
        assert sorted(tensorboard_scalars(tmp_path / "tensorboard")) == [("x", step) for step in range(5)]
        run_dir.write_summary("done")
    with pytest.raises(RunDirError, match="finished run"):
        RunDir.create(tmp_path, config)
    assert RunDir.create(tmp_path, config, overwrite=True).read_metrics() == []
