"""The accelerator check script's CPU dry run: every step runs and prints its measurements."""

import subprocess

import pytest


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step_on_the_cpu():
    out = subprocess.run(["bash", "experiments/launch/gpu_check.sh", "--dry-run", "--repeats", "1"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(" tests collected in " in line for line in lines), out.stdout
    for kind in ("sampler ", "rollout ", "train "):
        assert any(line.startswith(kind) and "tok/s" in line for line in lines), (kind, out.stdout)
    assert any("MFU" in line for line in lines) and lines[-1] == "gpu_check: done"
