"""End-to-end tests of the training loop on the target-word task with tiny models."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.run import prepare
from scope_jax.training.config import default_config
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train import train
from tests.conftest import COMPILE_FAST
from tests.training.conftest import tensorboard_scalars

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Keys that depend only on the seed and the computation (not on wall-clock time).
DETERMINISTIC = ("reward", "loss", "agent/entropy", "grad_norm", "monitor/zero_variance_groups",
                 "rollout/cache_fallbacks", "rollout/prefill_tokens", "rollout/reused_tokens")


def tiny_config(**train):
    config = default_config()
    config.optimizer.learning_rate = 3e-3
    config.train.update(train)
    return config


@pytest.mark.slow
def test_agent_learns_the_target_word_against_a_frozen_simulator(tmp_path):
    """... and with train.eval_first, step 0 is evaluated before its update (the untrained agent's
    baseline), as the last step is, with every held-out dialogue written: the logged held-out reward is
    the mean of those dialogues' rewards."""
    config = tiny_config(steps=30, eval_every=30, checkpoint_every=30, eval_first=True)
    _, checked = prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        train(config, run_dir, checked)
        metrics = run_dir.read_metrics()
    rewards = [r["reward"] for r in metrics]
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.3, (first, last)
    evaluated = [r for r in metrics if "heldout_reward" in r]
    assert [r["step"] for r in evaluated] == [0, 29]
    for record in evaluated:
        lines = (tmp_path / "run" / "samples" / f"eval-step-{record['step']}.jsonl").read_text().splitlines()
        dialogues = [json.loads(line) for line in lines]
        assert len(dialogues) == config.train.eval_groups * config.rollout.group_size
        assert {d["heldout"] for d in dialogues} == {0}
        assert record["heldout_reward"] == pytest.approx(np.mean([d["rewards"]["agent"] for d in dialogues]))
    # every step's rollout went through the KV caches (the default), each view an extension of its cache
    assert all(r["rollout/cache_fallbacks"] == 0 and r["rollout/reused_tokens"] > r["rollout/prefill_tokens"]
               for r in metrics)


def run_job(workdir: pathlib.Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "experiments.run", "--config=experiments/configs/target_word.py",
            f"--workdir={workdir}", "--config.train.steps=10", "--config.train.checkpoint_every=3",
            "--config.train.eval_every=4", *overrides]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "XLA_FLAGS": COMPILE_FAST}, text=True)


def records(workdir: pathlib.Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    keys = ("step", *DETERMINISTIC, "heldout_reward")
    found = [{k: r[k] for k in keys if k in r} for r in map(json.loads, lines)]
    assert all(set(DETERMINISTIC) <= set(r) for r in found)  # every compared key is logged
    return found


@pytest.mark.slow
def test_sigkill_and_resume_logs_the_same_metrics_as_an_uninterrupted_run(tmp_path):
    # One run after the other: the later runs load the reference's programs from the compilation cache.
    reference = run_job(tmp_path / "reference")
    out, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, out
    killed = run_job(tmp_path / "killed")
    checkpoint = tmp_path / "killed" / "checkpoints" / "6"
    deadline = time.time() + 600
    while not checkpoint.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), killed.communicate()[0]
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "killed" / "summary.md").exists()

    resumed = run_job(tmp_path / "killed")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert "resumed from step 6" in out or "resumed from step 9" in out, out
    assert records(tmp_path / "killed") == records(tmp_path / "reference")
    # tensorboard holds every step once: the killed run's events past its checkpoint were dropped
    killed, reference = (tensorboard_scalars(tmp_path / run / "tensorboard")
                         for run in ("killed", "reference"))
    assert sorted(killed) == sorted(reference) and len(set(killed)) == len(killed)


def test_finished_run_is_not_overwritten_and_another_config_is_refused(tmp_path):
    config = tiny_config(steps=2, eval_every=0, checkpoint_every=1)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        train(config, run_dir)
        run_dir.write_summary("done")
    done = subprocess.run([sys.executable, "-m", "experiments.run",
                           "--config=experiments/configs/target_word.py", f"--workdir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "finished run" in done.stderr
    (tmp_path / "run" / "summary.md").unlink()
    other = tiny_config(steps=2, eval_every=0, checkpoint_every=1)
    other.seed = 1
    with pytest.raises(Exception, match="another config"):
        RunDir.create(tmp_path / "run", other)
