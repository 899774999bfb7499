"""Config validation and the runner's one-line errors."""

import pathlib
import subprocess
import sys

import ml_collections
import pytest

from experiments.run import prepare
from scope_jax.config import ConfigError, validate
from scope_jax.training.run_dir import RunDir, RunDirError

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


def test_run_dir_refuses_a_finished_run_and_truncates_resumed_metrics(tmp_path):
    config = {"a": 1}
    with RunDir.create(tmp_path, config) as run_dir:
        for step in range(5):
            run_dir.log(step, {"x": float(step)})
        run_dir.truncate_metrics(3)
        assert [r["step"] for r in run_dir.read_metrics()] == [0, 1, 2]
        run_dir.write_summary("done")
    with pytest.raises(RunDirError, match="finished run"):
        RunDir.create(tmp_path, config)
    assert RunDir.create(tmp_path, config, overwrite=True).read_metrics() == []
