#!/usr/bin/env bash
# One experiment on a Cloud TPU VM pod slice: the same command on every host (HOSTS: the slice's host
# count); the mesh's data axis spans the hosts, fsdp takes each host's chips (docs/distributed.md).
#   gcloud compute tpus tpu-vm ssh NAME --worker=all --command="cd scope-jax && \
#     HOSTS=4 bash experiments/launch/tpu_pod.sh experiments/configs/p4g_rl.py"
set -euo pipefail
config=$1; shift
pip install -q -c .ci/constraints.txt -e ".[tpu]"
# On TPU VMs jax.distributed.initialize() discovers the slice's hosts by itself; each host plays its
# share of every step's rollout shards (one per host by default).
python -m experiments.run --config="$config" --distributed --workdir="runs/$(basename "$config" .py)-tpu" \
  --config.mesh.data="${HOSTS:?set HOSTS to the slice's host count}" --config.mesh.fsdp=-1 \
  --config.rollout.shards="$HOSTS" "$@"
