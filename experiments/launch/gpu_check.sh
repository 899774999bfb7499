#!/usr/bin/env bash
# The accelerator check, in one go (on one H200: tests 1 to 2.5 minutes, then about 5.5 minutes of benchmarks
# per model; docs/gpu_check.md has the run):
#   bash experiments/launch/gpu_check.sh            # on a machine with a GPU (jax[cuda12] installed)
#   bash experiments/launch/gpu_check.sh --dry-run  # the same steps, tiny shapes, on the CPU (a test runs it)
# 1. The sampler, KV-cache, attention and sharding tests on the GPU. Tests that build 8-device meshes need
#    8 devices; with fewer they are deselected (CI runs them on 8 fake CPU devices). Dry run: only collected.
# 2. experiments.gpu_check: sampler, multi-turn rollout and train step in bfloat16 on Qwen3-0.6B- and
#    1.7B-shaped random weights: tokens/s, MFU against the device's peak, memory.
# The benchmarks run even when a test fails (the script then exits with the tests' status), so one failure
# on a leased machine does not cost the numbers. PYTHON names the interpreter (default: python).
set -euo pipefail
cd "$(dirname "$0")/../.."
dry_run=""
python="${PYTHON:-python}"
if [[ "${1:-}" == "--dry-run" ]]; then dry_run="--dry-run"; shift; fi

tests=(tests/test_sampling.py tests/test_kv_cache.py tests/models/test_attention.py tests/models/test_parity.py
       tests/training/test_train_step.py)
if [[ -n "$dry_run" ]]; then
  "$python" -m pytest -q -n 0 --collect-only -p no:cacheprovider "${tests[@]}" | tail -n 1
  "$python" -m experiments.gpu_check --dry-run --models 0.6b "$@"
else
  devices=$(JAX_PLATFORMS= "$python" -c "import jax; print(jax.device_count())")
  deselect=()
  if (( devices < 8 )); then
    deselect=(-k "not mesh and not devices and not population_generation and not sharded and not fsdp")
  fi
  echo "== tests on $devices device(s)"
  # setup.cfg's addopts are replaced: the machine's pytest-xdist may not know all of them. The tests compare
  # float32 numerics with references at float32 tolerances, so they run at full float32 matmul precision:
  # on NVIDIA GPUs XLA's default float32 matmul is TF32, about 3e-4 relative error (docs/gpu_check.md).
  tests_status=0
  JAX_PLATFORMS= JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 "$python" -m pytest -q -p no:cacheprovider \
    -o addopts="-ra --strict-markers" "${deselect[@]}" "${tests[@]}" || tests_status=$?
  echo "== benchmarks"
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 900 "$python" -m experiments.gpu_check "$@"
  exit "$tests_status"
fi
