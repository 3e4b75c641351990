#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM slice (e.g. v4-64): create it, install this package on every worker,
# train on --worker=all with logs, delete it. Copy this script and edit the defaults below.
set -euo pipefail

NAME="${TPU_NAME:-electra-large}"
ZONE="${TPU_ZONE:-us-central2-b}"
ACCELERATOR="${TPU_ACCELERATOR:-v4-64}"
VERSION="${TPU_VERSION:-}"
# The workers' images run Python 3.10; install makes an environment of this Python (>= 3.11).
PYTHON="3.11"
VENV="electra_venv"
PROJECT="${TPU_PROJECT:-}"
CONFIG="configs/large.py"
WORKDIR="${WORKDIR:-}"  # train needs one, e.g. gs://YOUR_BUCKET/electra_large
CACHE=""
SPOT=0
QUEUED=0
WAIT=""
POLL="${TPU_POLL_SECONDS:-60}"
PRINT=0
EXTRA=()

usage() {
  cat <<'USAGE'
Usage: launch/tpu_vm.sh [options] STEP [-- TRAIN_FLAGS...]

Steps (run them in order; each is one gcloud call per line):
  create    create the TPU VM (or a queued resource with --queued, waiting until ACTIVE)
  install   copy this repository to every worker and install it with JAX for TPU into a
            Python 3.11 environment, ~/electra_venv (uv makes it: the images have Python 3.10)
  train     run python -m electra_jax.train (of ~/electra_venv) on --worker=all; output also
            goes to logs/NAME-*.log
  delete    delete the TPU VM (or the queued resource)

Options:
  --name=NAME            TPU name (default $TPU_NAME or electra-large)
  --zone=ZONE            zone (default $TPU_ZONE or us-central2-b)
  --accelerator=TYPE     accelerator type, e.g. v4-64, v5litepod-64 (default $TPU_ACCELERATOR or v4-64)
  --version=VERSION      TPU software version (default $TPU_VERSION, else the accelerator's:
                         v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5litepod v2-alpha-tpuv5-lite,
                         v2-v4 tpu-ubuntu2204-base)
  --project=PROJECT      GCP project (default $TPU_PROJECT, else gcloud's configured project)
  --config=FILE          experiment config (default configs/large.py)
  --workdir=DIR          training workdir, a gs:// path shared by all workers (default
                         $WORKDIR); train needs one
  --cache=DIR            persistent XLA compilation cache shared by the workers and by restarts
                         (default WORKDIR/jax_cache): a restarted job does not compile again
  --spot                 use Spot capacity (preemptible; training resumes from checkpoints)
  --queued               obtain the slice through a queued resource; create waits until it is
                         ACTIVE and stops (exit 1) if it fails, is suspended or deleted
  --wait=MINUTES         with --queued create: stop waiting after MINUTES (default: no limit;
                         the request stays queued)
  --print                print the gcloud commands instead of running them
  -h, --help             show this help

install sends the checkout this script is in (under launch/); a copy kept elsewhere names
the checkout with ELECTRA_JAX_REPO=DIR.
Every worker runs the same command; jax.distributed.initialize() finds the other workers on its
own, and the same command resumes from the latest checkpoint after a preemption.
Example: launch/tpu_vm.sh --workdir=gs://my-bucket/large --spot --queued create
USAGE
}

# Runs a command, or with --print shows it (shell-quoted) instead.
run() {
  if [[ "${PRINT}" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# Polls the queued resource until it is ACTIVE; exits 1 when it can no longer become ACTIVE
# (FAILED, SUSPENDED, being deleted), when gcloud cannot describe it, or after --wait minutes.
wait_until_active() {
  local state start="${SECONDS}"
  local check="gcloud compute tpus queued-resources describe ${NAME} ${LOCATION[*]}"
  echo "Waiting for queued resource ${NAME} to become ACTIVE ..." >&2
  while true; do
    if ! state="$("${GCLOUD[@]}" queued-resources describe "${NAME}" "${LOCATION[@]}" \
                  --format='value(state.state)')"; then
      echo "error: gcloud could not describe queued resource ${NAME} (above); see: ${check}" >&2
      exit 1
    fi
    case "${state}" in
      ACTIVE) echo "Queued resource ${NAME} is ACTIVE" >&2; return ;;
      CREATING|ACCEPTED|PROVISIONING|WAITING_FOR_RESOURCES) ;;
      *) echo "error: queued resource ${NAME} is ${state:-in no state} and will not become" \
           "ACTIVE; see why: ${check}; remove it: launch/tpu_vm.sh --queued --name=${NAME}" \
           "delete" >&2
         exit 1 ;;
    esac
    if [[ -n "${WAIT}" ]] && (( SECONDS - start >= 10#${WAIT} * 60 )); then
      echo "error: queued resource ${NAME} is still ${state} after ${WAIT} minutes (--wait);" \
        "it stays queued: follow it with ${check}, or remove it: launch/tpu_vm.sh --queued" \
        "--name=${NAME} delete" >&2
      exit 1
    fi
    sleep "${POLL}"
  done
}

STEP=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --name=*) NAME="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --cache=*) CACHE="${1#*=}" ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    --wait=*) WAIT="${1#*=}" ;;
    --print) PRINT=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    create|install|train|delete)
      if [[ -n "${STEP}" ]]; then
        echo "error: one step at a time ('${STEP}', then '$1'); run the script once per step" >&2
        exit 2
      fi
      STEP="$1" ;;
    *) echo "error: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "${STEP}" ]]; then
  echo "error: give a step: create, install, train or delete; see --help" >&2
  exit 2
fi
if [[ -n "${WAIT}" && ! ( "${QUEUED}" == 1 && "${STEP}" == create ) ]]; then
  echo "error: --wait=${WAIT} is for --queued create (how long to wait until ACTIVE)" >&2
  exit 2
fi
if [[ ${#EXTRA[@]} -gt 0 && "${STEP}" != train ]]; then
  echo "error: flags after -- (${EXTRA[*]}) are for the train step, not ${STEP}" >&2
  exit 2
fi
if [[ "${STEP}" == train && -z "${WORKDIR}" ]]; then
  echo "error: train needs --workdir=gs://BUCKET/DIR (shared by every worker; or set WORKDIR);" \
    "see --help" >&2
  exit 2
fi
if [[ -n "${WAIT}" && ! "${WAIT}" =~ ^[0-9]+$ ]]; then
  echo "error: --wait=${WAIT} must be a whole number of minutes, e.g. --wait=120" >&2
  exit 2
fi
# Google's software version for each TPU generation (cloud.google.com/tpu/docs/runtimes):
# only create names one.
if [[ -z "${VERSION}" && "${STEP}" == create ]]; then
  case "${ACCELERATOR}" in
    v6e-*) VERSION="v2-alpha-tpuv6e" ;;
    v5p-*) VERSION="v2-alpha-tpuv5" ;;
    v5litepod-*) VERSION="v2-alpha-tpuv5-lite" ;;
    v2-*|v3-*|v4-*) VERSION="tpu-ubuntu2204-base" ;;
    *) echo "error: no TPU software version known for --accelerator=${ACCELERATOR}; pass" \
         "--version=VERSION (see cloud.google.com/tpu/docs/runtimes)" >&2
       exit 2 ;;
  esac
fi

GCLOUD=(gcloud compute tpus)
LOCATION=(--zone="${ZONE}")
if [[ -n "${PROJECT}" ]]; then
  LOCATION+=(--project="${PROJECT}")
fi
SSH=("${GCLOUD[@]}" tpu-vm ssh "${NAME}" "${LOCATION[@]}" --worker=all)

case "${STEP}" in
  create)
    CAPACITY=()
    if [[ "${SPOT}" == 1 ]]; then
      CAPACITY=(--spot)
    fi
    if [[ "${QUEUED}" == 1 ]]; then
      run "${GCLOUD[@]}" queued-resources create "${NAME}" "${LOCATION[@]}" \
        --node-id="${NAME}" --accelerator-type="${ACCELERATOR}" \
        --runtime-version="${VERSION}" ${CAPACITY[@]+"${CAPACITY[@]}"}
      if [[ "${PRINT}" == 0 ]]; then
        wait_until_active
      fi
    else
      run "${GCLOUD[@]}" tpu-vm create "${NAME}" "${LOCATION[@]}" \
        --accelerator-type="${ACCELERATOR}" --version="${VERSION}" \
        ${CAPACITY[@]+"${CAPACITY[@]}"}
    fi
    ;;
  install)
    REPO="${ELECTRA_JAX_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
    if [[ ! -f "${REPO}/setup.cfg" || ! -d "${REPO}/electra_jax" ]]; then
      echo "error: '${REPO}' is not an electra_jax checkout (install sends the one this script" \
        "is in, under launch/); keep the copy there or set ELECTRA_JAX_REPO=DIR" >&2
      exit 2
    fi
    ARCHIVE="${TMPDIR:-/tmp}/electra_jax-${NAME}.tar.gz"
    # The checkout's own files, not what .gitignore keeps out of it (a venv of gigabytes, the
    # GPU wheels, run outputs): git lists them, tracked or new; without git, .gitignore's list.
    if git -C "${REPO}" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
      run bash -c 'cd "$1" && git ls-files -z --cached --others --exclude-standard \
        | tar -czf "$2" --null --ignore-failed-read -T -' _ "${REPO}" "${ARCHIVE}"
    else
      run tar -czf "${ARCHIVE}" -C "${REPO}" --exclude=./.git --exclude=__pycache__ \
        --exclude='*.egg-info' --exclude=./build --exclude=./dist --exclude=.pytest_cache \
        --exclude=./.whl --exclude=./workdirs --exclude=./.ci/venv --exclude=./logs .
    fi
    run "${GCLOUD[@]}" tpu-vm scp "${ARCHIVE}" "${NAME}:electra_jax.tar.gz" "${LOCATION[@]}" \
      --worker=all
    run "${SSH[@]}" --command="mkdir -p electra_jax && tar -xzf electra_jax.tar.gz -C electra_jax \
&& python3 -m pip install -q --user uv \
&& python3 -m uv venv -q --python ${PYTHON} --allow-existing ${VENV} \
&& python3 -m uv pip install -q --python ${VENV}/bin/python -e 'electra_jax[tpu]'"
    ;;
  train)
    printf -v FLAGS ' %q' ${EXTRA[@]+"${EXTRA[@]}"}
    if [[ ${#EXTRA[@]} -eq 0 ]]; then
      FLAGS=""
    fi
    # Quoted for the worker's shell, as the extra flags are: a path may hold a space.
    printf -v PATH_FLAGS ' %q' "--config=${CONFIG}" "--workdir=${WORKDIR}" \
      "--compilation_cache_dir=${CACHE:-${WORKDIR%/}/jax_cache}"
    COMMAND="cd electra_jax && ~/${VENV}/bin/python -m electra_jax.train${PATH_FLAGS}${FLAGS}"
    if [[ "${PRINT}" == 1 ]]; then
      run "${SSH[@]}" --command="${COMMAND}"
    else
      mkdir -p logs
      LOG="logs/${NAME}-$(date +%Y%m%d-%H%M%S).log"
      echo "Logging to ${LOG}" >&2
      run "${SSH[@]}" --command="${COMMAND}" 2>&1 | tee -a "${LOG}"
    fi
    ;;
  delete)
    if [[ "${QUEUED}" == 1 ]]; then
      run "${GCLOUD[@]}" queued-resources delete "${NAME}" "${LOCATION[@]}" --force --quiet
    else
      run "${GCLOUD[@]}" tpu-vm delete "${NAME}" "${LOCATION[@]}" --quiet
    fi
    ;;
esac
