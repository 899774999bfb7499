"""The collapse experiment resumes: finished arms are loaded, not rerun, and logged exactly once."""

import json

import numpy as np
import pytest

from scope_jax.testbed import arm_store, experiment
from scope_jax.testbed.arms import ARMS
from scope_jax.training.run_dir import METRICS, RunDir, RunDirError
from tests.testbed.conftest import QUICK, RL


class Interrupted(Exception):
    pass


def _arm_of(record):
    return next(k for k in record if k != "step").split("/", 1)[0]


def test_an_interrupted_run_resumes_without_rerunning_or_relogging_finished_arms(tmp_path, pretrained):
    arms = tuple(ARMS[a] for a in ("untrained", "frozen", "cotrain"))
    settings = experiment.Settings(seeds=(0,), arms=arms, pretrain=QUICK, rl=RL, heldout_seeds=(101,),
                                   vs_samples=1)
    run_dir = RunDir.create(tmp_path, {"test": "resume"})
    arm_store.save_tree(tmp_path / experiment.PRETRAINED, pretrained._asdict())

    def interrupt_before_cotrain(message):
        if message == "arm cotrain":
            raise Interrupted

    with pytest.raises(Interrupted):
        experiment.run(settings, run_dir, interrupt_before_cotrain)
    first = arm_store.ArmStore(run_dir).load("frozen")
    assert first is not None and arm_store.ArmStore(run_dir).load("cotrain") is None
    # a kill while the frozen arm's records were being written: only some of them reached the file
    metrics = tmp_path / METRICS
    lines = metrics.read_text().splitlines()
    frozen = [i for i, line in enumerate(lines) if _arm_of(json.loads(line)) == "frozen"]
    metrics.write_text("".join(line + "\n" for i, line in enumerate(lines) if i not in frozen[-3:]))

    messages = []
    results = experiment.run(settings, run_dir, messages.append)
    assert "arm untrained: finished in the run directory" in messages
    assert "arm frozen: finished in the run directory" in messages
    assert "arm cotrain" in messages
    records = run_dir.read_metrics()
    assert len({json.dumps(r, sort_keys=True) for r in records}) == len(records)  # no record twice
    for name, result in results.arms.items():
        assert sum(_arm_of(r) == name for r in records) == result.records, name
    for key, value in first.evals.items():
        np.testing.assert_array_equal(results.arms["frozen"].evals[key], value)


def test_a_damaged_saved_arm_is_named_with_what_to_do(tmp_path):
    path = tmp_path / "frozen.msgpack"
    arm_store.save_tree(path, {"label": "frozen", "evals": {"reward": np.arange(4.0)}})
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(RunDirError, match="frozen.msgpack is unreadable .*delete it, and the run computes"):
        arm_store.restore_tree(path)


def test_a_cut_short_last_record_is_warned_about_once_and_the_complete_arms_kept(tmp_path, capsys):
    result = arm_store.ArmResult("Frozen", {"reward": np.zeros((1, 2))}, np.array([0]),
                                 {"value": np.zeros((1, 1))}, 1.0)
    with RunDir.create(tmp_path, {"test": "logged"}) as run_dir:
        for name in ("frozen", "cotrain"):
            arm_store.log_arm(name, result, [0], lambda arm, step, metrics: run_dir.log(step, metrics,
                                                                                       prefix=f"{arm}/"))
    whole = (tmp_path / METRICS).read_text()
    (tmp_path / METRICS).write_text(whole[:-10])  # stopped while writing cotrain's last record
    logged = arm_store.ArmStore(RunDir(tmp_path)).logged({"frozen": result, "cotrain": result})
    assert logged == {"frozen"}
    assert capsys.readouterr().err.count("ends in a line that is not a whole record") == 1
    assert {_arm_of(json.loads(line)) for line in (tmp_path / METRICS).read_text().splitlines()} == {"frozen"}
