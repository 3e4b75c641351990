#!/usr/bin/env bash
# Pretrain across several machines without a scheduler: run this on every node with the same
# coordinator and process count and its own process id. Each node drives all its local GPUs.
set -euo pipefail

CONFIG="configs/large.py"
WORKDIR="${WORKDIR:-}"
COORDINATOR="${JAX_COORDINATOR_ADDRESS:-}"
NUM_PROCESSES="${JAX_NUM_PROCESSES:-}"
PROCESS_ID="${JAX_PROCESS_ID:-}"
CACHE=""
PRINT=0
EXTRA=()

usage() {
  cat <<'USAGE'
Usage: launch/multinode.sh --coordinator=HOST:PORT --num_processes=N --process_id=I \
         --workdir=DIR [--config=FILE] [--cache=DIR] [--print] [-- TRAIN_FLAGS...]

On node 0:  launch/multinode.sh --coordinator=node0:8476 --num_processes=2 --process_id=0 --workdir=/shared/run
On node 1:  launch/multinode.sh --coordinator=node0:8476 --num_processes=2 --process_id=1 --workdir=/shared/run

Sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (the defaults of the same
options) and runs python -m electra_jax.train, which joins the processes with
jax.distributed.initialize before using any device. HOST:PORT is process 0's address and a free
port reachable from every node; DIR must be shared by all nodes (NFS, GCS, ...).

Options:
  --coordinator=HOST:PORT   process 0's address (default $JAX_COORDINATOR_ADDRESS)
  --num_processes=N         number of processes, one per node (default $JAX_NUM_PROCESSES)
  --process_id=I            this node's index in [0, N) (default $JAX_PROCESS_ID)
  --workdir=DIR             shared training workdir (required; default $WORKDIR)
  --config=FILE             experiment config (default configs/large.py)
  --cache=DIR               persistent XLA compilation cache (default WORKDIR/jax_cache): a
                            restarted run loads its train step instead of compiling it again
  --print                   print the command instead of running it
  -h, --help                show this help
USAGE
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --coordinator=*) COORDINATOR="${1#*=}" ;;
    --num_processes=*) NUM_PROCESSES="${1#*=}" ;;
    --process_id=*) PROCESS_ID="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --cache=*) CACHE="${1#*=}" ;;
    --print) PRINT=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "error: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
  shift
done
for pair in "coordinator:${COORDINATOR}" "num_processes:${NUM_PROCESSES}" \
            "process_id:${PROCESS_ID}" "workdir:${WORKDIR}"; do
  if [[ -z "${pair#*:}" ]]; then
    echo "error: --${pair%%:*} is required; see --help" >&2
    exit 2
  fi
done

COMMAND=(env "JAX_COORDINATOR_ADDRESS=${COORDINATOR}" "JAX_NUM_PROCESSES=${NUM_PROCESSES}"
         "JAX_PROCESS_ID=${PROCESS_ID}" python -m electra_jax.train --config="${CONFIG}"
         --workdir="${WORKDIR}" --compilation_cache_dir="${CACHE:-${WORKDIR%/}/jax_cache}"
         ${EXTRA[@]+"${EXTRA[@]}"})
if [[ "${PRINT}" == 1 ]]; then
  printf '%q ' "${COMMAND[@]}"
  printf '\n'
else
  exec "${COMMAND[@]}"
fi
