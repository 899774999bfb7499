#!/usr/bin/env bash
# One experiment on a Slurm GPU cluster: one process per node, all GPUs of a node in that process.
#   sbatch --nodes=2 --gpus-per-node=8 experiments/launch/gpu_slurm.sh experiments/configs/p4g_rl.py --config.mesh.fsdp=16
#SBATCH --job-name=scope-jax
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
set -euo pipefail
config=$1; shift
pip install -q -c .ci/constraints.txt -e ".[cuda12]"
# jax.distributed.initialize() reads the coordinator address and process ids from Slurm's environment.
srun python -m experiments.run --config="$config" --distributed --workdir="runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}" "$@"
