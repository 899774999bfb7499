#!/usr/bin/env bash
# One experiment on a Cloud TPU VM pod slice: the same command on every host.
#   gcloud compute tpus tpu-vm ssh NAME --worker=all --command="cd scope-jax && \
#     bash experiments/launch/tpu_pod.sh experiments/configs/p4g_rl.py --config.mesh.fsdp=-1"
set -euo pipefail
config=$1; shift
pip install -q -c .ci/constraints.txt -e ".[tpu]"
# On TPU VMs jax.distributed.initialize() discovers the slice's hosts by itself.
python -m experiments.run --config="$config" --distributed --workdir="runs/$(basename "$config" .py)-tpu" "$@"
