#!/usr/bin/env bash
# Pretrain on a multi-node GPU cluster with SLURM: one process per GPU (JAX's SLURM convention).
# Submit with: sbatch launch/slurm_gpu.sh --config=configs/large.py --workdir=/shared/electra
# Edit the #SBATCH lines for your cluster (nodes, GPUs per node, partition, time).
#SBATCH --job-name=electra
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=48:00:00
# SLURM opens the output file before the script runs: a directory in its path must exist then.
#SBATCH --output=%x-%j.out
#SBATCH --signal=TERM@300
set -euo pipefail

CONFIG="configs/large.py"
WORKDIR="${WORKDIR:-}"
CACHE=""
PRINT=0
EXTRA=()

usage() {
  cat <<'USAGE'
Usage: sbatch launch/slurm_gpu.sh --config=FILE --workdir=DIR [--cache=DIR] [--print] [-- TRAIN_FLAGS...]

Runs python -m electra_jax.train under srun, one task per GPU (see the #SBATCH lines), its
output in electra-JOBID.out in the directory sbatch was run from. Each task calls
jax.distributed.initialize(), which reads the SLURM environment (coordinator = first node,
process id = SLURM_PROCID, GPU = SLURM_LOCALID), so all GPUs of all nodes form one mesh. DIR
must be on a filesystem every node sees. SLURM sends SIGTERM 5 minutes before the time limit: training saves
a checkpoint and exits, and resubmitting the same command resumes.

Options:
  --config=FILE   experiment config (default configs/large.py)
  --workdir=DIR   shared training workdir (required; default $WORKDIR)
  --cache=DIR     persistent XLA compilation cache for the resubmitted job (default
                  WORKDIR/jax_cache): it loads its train step instead of compiling it again
  --print         print the srun command instead of running it (works outside SLURM)
  -h, --help      show this help
Install first on a shared filesystem: pip install -e '.[cuda12]' (or '.[cuda13]')
USAGE
}

run() {
  if [[ "${PRINT}" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --cache=*) CACHE="${1#*=}" ;;
    --print) PRINT=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "error: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "${WORKDIR}" ]]; then
  echo "error: --workdir is required (a directory every node can write); see --help" >&2
  exit 2
fi
if [[ "${PRINT}" == 0 && -z "${SLURM_JOB_ID:-}" ]]; then
  echo "error: not inside a SLURM job; submit with sbatch, or use --print" >&2
  exit 2
fi

# Slurm 22.05 stopped passing the job's --cpus-per-task on to srun: the data loader of each
# task would get one CPU.
CPUS=()
if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
  CPUS=(--cpus-per-task="${SLURM_CPUS_PER_TASK}")
fi
run srun --kill-on-bad-exit=1 ${CPUS[@]+"${CPUS[@]}"} python -m electra_jax.train --config="${CONFIG}" \
  --workdir="${WORKDIR}" --compilation_cache_dir="${CACHE:-${WORKDIR%/}/jax_cache}" \
  ${EXTRA[@]+"${EXTRA[@]}"}
