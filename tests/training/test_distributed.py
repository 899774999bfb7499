"""Multi-process RL on this machine (experiments.launch_local): 2 processes of 1 CPU device each against one
process of 2 devices, with the same rollout shards (scope_jax.distributed).

Tolerance: the sampled tokens, masks and positions must be equal, and so must every count. Floats get
rtol 1e-5: the runs compute the same rows in other batch shapes (a process's shard alone vs. the whole
batch over two devices) and sum the gradient across processes through gloo rather than within one
process, so float32 rounding may differ in the last bits, and 3 steps of Adam carry it on; 1e-5 is about
a hundred times float32's epsilon. (On this machine the runs came out bit-identical.)
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments import launch_local, run
from experiments.launch_local import with_host_devices
from scope_jax.distributed import Shards
from tests.training.distributed_error import MESSAGE
from tests.training.test_loop import DETERMINISTIC

ROOT = pathlib.Path(__file__).resolve().parents[2]
RTOL = 1e-5
LOST_BOUND_S = 30  # the launcher's grace (10 s) to stop the others, plus polling and process exit
ERROR_BOUND_S = 90  # two processes start, import jax and connect, then a grace of 1 s
# tests/conftest.py's XLA flags and compilation cache; the device count is replaced
ENV = dict(os.environ)
RUN = ["--config=experiments/configs/target_word.py", "--config.mesh.data=-1", "--config.rollout.shards=2"]


def one_process(module: str, *args: str) -> subprocess.Popen:
    """`module` on one process of 2 CPU devices."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=with_host_devices(ENV, 2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def two_processes(module: str, *args: str, grace: float = 10) -> subprocess.Popen:
    """`module` on 2 processes of 1 CPU device each (the launcher sets the device count)."""
    return subprocess.Popen([sys.executable, "-m", "experiments.launch_local", "--processes=2", "--devices=1",
                             f"--grace={grace}", f"--module={module}", "--", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended_within(job: subprocess.Popen, seconds: float) -> tuple[str, str]:
    """The job's stdout and stderr; if it has not ended within `seconds`, it is killed and the test fails."""
    try:
        return job.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        for pid in [*children(job.pid), job.pid]:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the job did not end within {seconds} s")


def finish(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    return out + err


def assert_same_steps(one: pathlib.Path, two: pathlib.Path) -> None:
    batches, reference = np.load(two / "batches.npz"), np.load(one / "batches.npz")
    assert sorted(batches) == sorted(reference)
    for key in reference:
        if reference[key].dtype.kind == "f":
            np.testing.assert_allclose(batches[key], reference[key], rtol=RTOL, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(batches[key], reference[key], err_msg=key)
    assert_same_metrics(*(json.loads((d / "metrics.json").read_text()) for d in (two, one)))


def assert_same_metrics(metrics: list[dict], expected: list[dict]) -> None:
    assert [sorted(m) for m in metrics] == [sorted(m) for m in expected]
    for got, want in zip(metrics, expected):
        np.testing.assert_allclose([got[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=RTOL,
                                   atol=1e-6, err_msg=str(sorted(want)))


def steps_on_one_and_two_processes(tmp_path: pathlib.Path, mode: str) -> None:
    args = (f"--mode={mode}", "--steps=3")
    reference = one_process("tests.training.distributed_steps", f"--out={tmp_path / 'one'}", *args)
    finish(reference)  # one after the other: two runs at once would share this machine's 2 cores
    finish(two_processes("tests.training.distributed_steps", f"--out={tmp_path / 'two'}", *args))
    assert_same_steps(tmp_path / "one", tmp_path / "two")


def test_shards_split_the_groups_over_the_processes_whole_and_in_order():
    groups, size = 8, 3
    shards = [Shards(4, processes=2, process=p) for p in range(2)]
    rows = [[i for s in part.mine() for i in part.items(s, groups * size)] for part in shards]
    assert rows[0] + rows[1] == list(range(groups * size))  # process 0's rows, then process 1's
    for process_rows in rows:
        assert len(process_rows) % size == 0 and process_rows[0] % size == 0  # whole groups
    assert [list(Shards(4, 2, 1).items(s, 8)) for s in Shards(4, 2, 1).mine()] == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="3 shards do not split over 2 processes"):
        Shards(3, processes=2, process=0)


def test_every_process_names_the_default_run_directory_with_process_0s_timestamp(monkeypatch):
    # as process 1 of 2, which started a second after process 0
    monkeypatch.setattr(run.distributed, "gather", lambda stamp: ["20261206-000000", stamp])
    assert run.default_workdir("experiments/configs/target_word.py:x") == pathlib.Path(
        "runs/target_word-x-20261206-000000")


# The frozen mode's metrics on two processes against one are compared by the lost-process test below, so the
# global batch is compared here in the mode that adds the most: a trained population of simulators.
@pytest.mark.slow
def test_two_processes_play_the_global_batch_and_metrics_of_one_with_a_trained_population(tmp_path):
    steps_on_one_and_two_processes(tmp_path, "population")


def test_groups_that_do_not_divide_over_the_processes_are_refused_in_one_line(tmp_path):
    job = two_processes("experiments.run", "--config=experiments/configs/target_word.py",
                        f"--workdir={tmp_path / 'run'}", "--config.rollout.groups=3",
                        "--config.rollout.shards=2")
    out, err = job.communicate(timeout=300)
    assert job.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == ["error: config key 'rollout.groups' or 'rollout.shards': 3 scenario groups do not "
                      "split into 2 shards (each process plays whole shards; see docs/distributed.md)"], err
    assert "Traceback" not in err


@pytest.mark.parametrize("error", ["user", "bug"])
def test_a_process_that_meets_an_error_alone_says_it_and_the_job_ends(error):
    # Process 0 waits in a collective that process 1 never joins: had process 1 then waited in JAX's
    # shutdown barrier, for process 0, neither would end.
    job = two_processes("tests.training.distributed_error", f"--error={error}", grace=1)
    _, err = ended_within(job, ERROR_BOUND_S)
    assert job.returncode == 1
    said = f"error: process 1 of 2: {MESSAGE}" if error == "user" else f"RuntimeError: {MESSAGE}"
    assert said in err.splitlines(), err


def test_an_error_every_process_meets_is_said_once_and_the_late_process_is_not_aborted():
    # Process 0 hosts the coordination service: had it left at once, process 1, still on its way to the
    # same error, would have been aborted by the service (SIGABRT) and named as killed by the launcher.
    job = two_processes("tests.training.distributed_error", "--error=config", grace=1)
    _, err = ended_within(job, ERROR_BOUND_S)
    assert job.returncode == 1
    assert [line for line in err.splitlines() if line.startswith("error:")] == [f"error: {MESSAGE}"], err
    assert "Check failure" not in err and "Fatal Python error" not in err, err


@pytest.mark.parametrize("options, expected", [
    (["--processes=abc"], "argument --processes: invalid int value: 'abc'"),
    (["--processes=2", "--grace=nan"], "--grace is nan; it must be a finite number of seconds, at least 0"),
    (["--processes=2", "--grace=-1"], "--grace is -1.0; it must be a finite number of seconds, at least 0"),
])
def test_the_launcher_refuses_bad_options_in_one_line(options, expected):
    with pytest.raises(SystemExit) as stopped:
        launch_local.main([*options, "--", "--config=experiments/configs/target_word.py"])
    assert stopped.value.code == f"error: {expected}"


def test_the_launcher_names_a_killed_process_even_after_another_failed_first():
    job = two_processes("tests.training.launcher_lost")
    _, err = ended_within(job, ERROR_BOUND_S)
    assert job.returncode == 1
    assert "error: process 1 of 2 was killed by SIGKILL; stopping the others" in err.splitlines(), err


def metric_records(workdir: pathlib.Path) -> list[dict]:
    keys = ("step", *DETERMINISTIC, "heldout_reward", "monitor/sim_deviation", "monitor/variance_sim_side")
    return [{k: r[k] for k in keys if k in r} for r in map(json.loads, (workdir / "metrics.jsonl").open())]


def children(pid: int) -> list[int]:
    return [int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.slow
def test_a_lost_process_stops_the_job_in_one_line_and_the_restarted_job_resumes_to_the_same_metrics(tmp_path):
    # An evaluation before the kill (step 2) and one after the resume (step 4).
    args = [*RUN, "--config.train.steps=4", "--config.train.checkpoint_every=2",
            "--config.train.eval_every=2"]
    finish(one_process("experiments.run", *args, f"--workdir={tmp_path / 'one'}"))
    killed = two_processes("experiments.run", *args, f"--workdir={tmp_path / 'two'}")
    checkpoint, deadline = tmp_path / "two" / "checkpoints" / "2", time.time() + 600
    while not checkpoint.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), killed.communicate()[1][-3000:]
    os.kill(children(killed.pid)[1], signal.SIGKILL)
    lost = time.time()
    _, err = killed.communicate(timeout=LOST_BOUND_S)
    assert time.time() - lost < LOST_BOUND_S and killed.returncode == 1
    assert [line for line in err.splitlines() if "process 1" in line] == [
        "error: process 1 of 2 was killed by SIGKILL; stopping the others"], err
    assert not (tmp_path / "two" / "summary.md").exists()

    out = finish(two_processes("experiments.run", *args, f"--workdir={tmp_path / 'two'}"))
    assert "resumed from step" in out, out
    assert_same_metrics(metric_records(tmp_path / "two"), metric_records(tmp_path / "one"))


@pytest.mark.slow
def test_a_process_that_reaches_the_first_collective_late_is_waited_for():
    # XLA:CPU's gloo context creation gives up when a process arrives more than 30 s after another; the
    # context built in distributed.initialize lets the job's own first collective wait.
    job = two_processes("tests.training.distributed_late", "--late=32")
    out, err = ended_within(job, 150)  # without the context it fails too, after minutes of shutdown barriers
    assert job.returncode == 0, out + err
    # the launcher passes both processes' output through as it comes, so their lines may run together
    assert sorted(re.findall(r"process (\d) gathered \[\[0, 0\], \[1, 1\]\]", out)) == ["0", "1"], out
