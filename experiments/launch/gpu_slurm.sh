#!/usr/bin/env bash
# One experiment on a Slurm GPU cluster: one process per node, all GPUs of a node in that process; the
# mesh's data axis spans the nodes, fsdp / tensor stay within one (docs/distributed.md).
#   sbatch --nodes=2 --gpus-per-node=8 experiments/launch/gpu_slurm.sh experiments/configs/p4g_rl.py \
#     --config.mesh.fsdp=8
#SBATCH --job-name=scope-jax
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
set -euo pipefail
config=$1; shift
pip install -q -c .ci/constraints.txt -e ".[cuda12]"
# --distributed: jax.distributed.initialize() reads the coordinator address and process ids from Slurm's
# environment. Each node plays its share of every step's rollout shards (one per node by default, a
# multiple of the node count if you set it); --kill-on-bad-exit ends the job when one node's process dies.
srun --kill-on-bad-exit=1 python -m experiments.run --config="$config" --distributed \
  --workdir="runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}" --config.mesh.data="$SLURM_NNODES" \
  --config.rollout.shards="$SLURM_NNODES" "$@"
