#!/usr/bin/env bash
# Issue 20's GPU measurements in stages, each inside one device call's 10 minutes on one H100.
# Run from the repository root on the GPU machine:
#
#   bash benchmarks/gpu_suite.sh STAGE[,STAGE...] OUT_DIR
#       STAGE: tests | small | base | large | profile | parts | pretrain | graphs | calls | wwm
#
# Several stages in one call save a machine start where they fit together in 10 minutes; each
# runs even when one before it failed, and any failure fails the call. Measured on an H100
# (2026-11-25) and an H200 (2026-11-26; benchmarks/RESULTS.md): XLA compiles a Small train
# step in 55-100 s (autotuning), so each benchmark costs 1-2 minutes before its first timed
# step. Stage lengths: small about 3.5 min when profile ran first in the call (two compiles
# and the HF references; 6 min alone), profile about 2 min (Base about 3), parts about 8.5 min
# (five compiles), base about 7 min, tests over 6 min, pretrain 8 min at PRETRAIN_STEPS=12000,
# graphs about 4 min (two or three compiles), large about 4 min on an H200 (its compile 121 s
# when the machine was warm; over 250 s in a first call), parts of Base with two variants
# about 3.5 min; calls about 2.5 min per N on an H100 (2026-11-27: compile 107 s at N = 100,
# 84 s at N = 1), pretrain at PRETRAIN_FLAGS='--config.steps_per_execution=100' a first call
# of 127 s (compile included) after about 90 s of set-up (H200, 2026-11-27: all 12,000 steps
# in 324 s: 55 s of set-up, a first call of 86.5 s, 12.9 ms a step).
#
# The machine's image has jax (CUDA), flax, optax, orbax, torch and transformers but not grain,
# array-record, ml-collections or tensorboardX: fetch their wheels here first, once
# (benchmarks/fetch_gpu_wheels.sh writes the git-ignored .whl/), and carry `.whl` on each call.
# Each stage writes STAGE-*.log and appends the benchmark JSON lines to OUT_DIR/results.jsonl
# (a failed benchmark: "!! NAME failed" on stderr, the stage goes on and exits 1);
# copy the figures into benchmarks/RESULTS.md with date, device and commit.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo 'usage: gpu_suite.sh STAGE[,STAGE...] OUT_DIR' >&2
  echo '  STAGE: tests, small, base, large, profile, parts, pretrain, graphs, calls or wwm' >&2
  exit 2
fi
stages=$1
out=$2
IFS=, read -ra stage_list <<< "$stages"
for stage in "${stage_list[@]}"; do
  case $stage in
    tests|small|base|large|profile|parts|pretrain|graphs|calls|wwm) ;;
    *) echo "unknown stage '$stage'; use tests, small, base, large, profile, parts, pretrain," \
            "graphs, calls or wwm" >&2
       exit 2 ;;
  esac
done
mkdir -p "$out"
if compgen -G '.whl/*.whl' >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD
fi
# The image lacks these (benchmarks/fetch_gpu_wheels.sh): stop now, not after a machine start
# and a failed first command.
python3 -c 'import grain, ml_collections, tensorboardX' || {
  echo 'grain, ml_collections or tensorboardX not importable (above): run' \
       'benchmarks/fetch_gpu_wheels.sh and carry .whl' >&2
  exit 2
}
export PYTHONUNBUFFERED=1
# JAX and PyTorch share the GPU in --compare runs: no preallocation of 75 % by XLA.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    > "$out/nvidia-smi.csv" 2>&1
{ python3 -c 'import jax; print(jax.__version__, jax.devices())'
  python3 -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda.*|flax|optax|orbax-checkpoint'\
'|chex|etils|grain|tensorstore|numpy|torch|transformers) '
} > "$out/versions.txt" 2>&1

# Compiled steps (JAX's persistent cache) and XLA's GPU autotuning results, shared by the
# benchmarks and the pretraining run of a call (and of the next call while the machine is still
# warm): the profile and parts stages' Small steps load the one the small stage compiled (about
# 90 s each on an H100) and variants reuse autotuned kernels. compile_s then times a cache load.
# The tests stage compiles afresh.
cache=${GPU_SUITE_CACHE:-/tmp/electra_gpu_suite_cache}
mkdir -p "$cache/autotune"
autotune="--xla_gpu_per_fusion_autotune_cache_dir=$cache/autotune"
# An XLA that no longer knows the flag would abort every run: probe it once (a few seconds).
XLA_FLAGS="${XLA_FLAGS:-} $autotune" python3 -c 'import jax; jax.devices()' >/dev/null 2>&1 \
    || { echo "note: this XLA has no ${autotune%%=*}; autotuning is not cached" >&2; autotune=; }
cached() {  # cached COMMAND...: run with the caches above.
  JAX_COMPILATION_CACHE_DIR=$cache/jax XLA_FLAGS="${XLA_FLAGS:-} $autotune" "$@"
}

# The paper's vocabulary (BERT uncased WordPiece) and bf16 compute in every benchmark.
common=(--config.vocab_size=30522 --config.dtype=bfloat16)

failed=0
measure() {  # measure NAME PYTHON_ARGS... --config=FILE ...: one run, its log, its JSON line.
  local name=$1 log rc
  log=$out/$stage-$name.log
  shift
  echo "== $name: $*"
  # --config=FILE must come before any --config.KEY override (absl refuses them otherwise).
  cached python3 "$@" "${common[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if ((rc)); then
    echo "!! $name failed (exit $rc); see $log" >&2
    failed=1
  else
    grep '^{' "$log" | tail -n 1 >> "$out/results.jsonl"
  fi
}
bench() { measure "$1" -m electra_jax.benchmark "${@:2}"; }  # bench NAME --config=FILE ...

run_stage() {  # run_stage STAGE: its commands; returns the last one's (pretrain: the run's) status.
case $1 in
  tests)  # The attention, model, objective and train-step tests on the GPU backend,
    # bit-for-bit reproducible as README says a GPU run is with this flag (without it XLA:GPU's
    # atomic reductions differ at rounding level between runs). test_model_objective.py alone
    # ran over 220 s on an H100 (2026-11-25): GPU_TESTS='FILE ...' runs some in a call. One
    # test process (-n 0): parallel workers would each take most of the GPU's memory.
    read -ra test_files <<< "${GPU_TESTS:-tests/test_attention.py tests/test_model_objective.py \
tests/test_train_step.py tests/test_benchmark.py}"
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true" python3 -m pytest -q -rfE \
        -n 0 -p no:cacheprovider "${test_files[@]}" 2>&1 | tee "$out/tests.log" ;;
  small)  # Target: step <= 11 ms at batch 128 x 128 (as training runs: pipelined_step_ms;
    # step_ms waits for each step); >= 2x the HF reference (step_ms, both timed alike).
    bench small --config=configs/small.py --steps=50 --warmup=5 --rounds=2 \
        --compare=hf,hf_full
    # Attention dropout 0: one fused attention call, cuDNN's flash attention on an NVIDIA GPU
    # (config.attention_implementation=auto; the JSON's "attention" says which ran).
    bench small_no_attn_dropout --config=configs/small.py --config.attention_dropout_rate=0 \
        --steps=50 --warmup=5 ;;
  base)  # Target: MFU >= 50 % at batch 256 x 512 (accumulated); >= 2x the HF reference.
    bench base_b32 --config=configs/base.py --config.train_batch_size=32 --steps=20 \
        --warmup=3 --compare=hf
    bench base_b256_accum4 --config=configs/base.py --config.grad_accum_steps=4 --steps=10 \
        --warmup=2 ;;
  large)  # Target: MFU >= 50 % at the per-device batch that fits. One compile of Large takes
    # 2-4 minutes, so a call holds one: LARGE_BATCH and LARGE_REMAT choose it (default batch 32
    # without remat: 49 GB peak on an H200), LARGE_FLAGS adds overrides (e.g.
    # '--config.attention_dropout_rate=0': cuDNN's attention) and names the run after them.
    remat=${LARGE_REMAT:-none}
    read -ra extra <<< "${LARGE_FLAGS:-}"
    tag=${LARGE_FLAGS:-}
    tag=$(printf '%s' "${tag//--config./}" | tr -c 'A-Za-z0-9_.' '_')
    bench "large_b${LARGE_BATCH:-32}_$remat${tag:+_$tag}" --config=configs/large.py \
        --config.train_batch_size="${LARGE_BATCH:-32}" --config.remat="$remat" "${extra[@]}" \
        --steps=10 --warmup=2 ;;
  graphs)  # The host's share of the Small step. XLA:GPU runs the step as one CUDA graph and
    # re-records it when a buffer it uses moved: every step of the 2026-11-26 H200 trace, 4-5 ms
    # of host time, then 14-17 ms in cuGraphLaunch for 2,780 commands. The update modes this
    # XLA knows keep addresses fixed instead; each is one compile (about 70 s), the default
    # comes from the cache when a stage before compiled it. Compare step_ms, host_dispatch_ms,
    # pipelined_step_ms and the losses (the same steps, so the same values up to GPU rounding);
    # each log ends with its 3 traced calls' graph updates and launch times (300 steps: Small
    # runs 100 a call).
    for mode in default NEVER_UPDATE CAPTURE_CMD_NEVER_UPDATE VMM_PERSISTENT_TEMP SKIP_TEMP; do
      flag=
      if [[ $mode != default ]]; then
        flag=--xla_gpu_command_buffer_update_mode=$mode
        if ! XLA_FLAGS="${XLA_FLAGS:-} $flag" python3 -c 'import jax; jax.devices()' \
            >/dev/null 2>&1; then
          echo "note: this XLA does not know $flag" >&2
          continue
        fi
      fi
      # XLA logs each re-record with the number of buffers whose address moved.
      XLA_FLAGS="${XLA_FLAGS:-} $flag" TF_CPP_MIN_LOG_LEVEL=0 \
          TF_CPP_VMODULE=command_buffer_thunk=3 bench "small_graphs_$mode" \
          --config=configs/small.py --steps=30 --warmup=3 --profile_dir="/tmp/electra_graphs_$mode"
      log=$out/graphs-small_graphs_$mode.log
      summary="== command buffer updates logged: $(grep -c 'Update command buffer' "$log"),"
      summary+=" executions: $(grep -c 'Execute command buffer' "$log"); updated_allocs:"
      summary+=$'\n'$(grep -o 'updated_allocs=[0-9]*' "$log" | sort | uniq -c)
      { echo "$summary"
        python3 benchmarks/profile_top_ops.py "/tmp/electra_graphs_$mode" --top=3
      } >> "$log" 2>&1
    done ;;
  calls)  # The Small step at N steps a call (config.steps_per_execution): the benchmark times
    # the loop's N-step program, one dispatch and one CUDA-graph update a call, where the
    # 2026-11-26 H100 trace showed 4 ms of graph update and 12 ms of launch a step against 15 ms
    # of kernels. CALLS='1 10 100' chooses the N (divisors of 100; each one compile, about 90 s;
    # N=1 comes from the cache when small ran before). Compare pipelined_step_ms (the loop's
    # pace), host_dispatch_ms (a call's, per step) and the losses. On the 2026-11-27 H100: 15.6
    # and 15.5 ms back to back at N = 1 and 100, but at 100 the host still spends 12.5 ms a
    # step driving the loop (XLA:GPU launches the body's graph per iteration; a call returns
    # near its end). XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL (the whole
    # loop as one graph) was tried on the 2026-11-27 H200: 18.4 ms back to back against 13.8,
    # the host held until the call ends; not adopted (RESULTS.md, session 23).
    read -ra counts <<< "${CALLS:-1 10 100}"
    for n in "${counts[@]}"; do
      bench "small_calls_$n" --config=configs/small.py --config.steps_per_execution="$n" \
          --steps=100 --warmup="$n"
    done ;;
  wwm)  # What whole-word masking costs the Small step: its word choice is up to
    # max_predictions unrolled rounds over the sequence (no while loop, which would split the
    # CUDA graph); on a 2-core CPU the demo's step was unchanged (171-172 ms). The default step
    # (from the cache when small ran before) and the whole-word one on the suite's synthetic
    # batches, words marked as in a vocabulary not read (every fifth id continues a word, about
    # BERT's share): two compiles, about 4 minutes.
    bench small_default --config=configs/small.py --steps=50 --warmup=5
    bench small_whole_word --config=configs/small.py --config.whole_word_masking=True \
        --steps=50 --warmup=5 ;;
  profile)  # A jax.profiler trace of three calls (Small: 100 steps each; traced_steps.json
    # says how many, and profile_top_ops.py divides by it) and the optimised HLO that names its
    # fusions (the trace shows only fusion names; the benchmark writes train_step.hlo.txt beside
    # it, also when the step comes from the cache), as one archive. The Small step by default;
    # PROFILE_CONFIG=base profiles Base at batch 32 x 512 (its MFU is the gap, issue 20),
    # PROFILE_FLAGS adds overrides.
    model=${PROFILE_CONFIG:-small}
    read -ra extra <<< "${PROFILE_FLAGS:-}"
    if [[ $model == base ]]; then extra=(--config.train_batch_size=32 "${extra[@]}"); fi
    bench "${model}_profile" --config="configs/$model.py" "${extra[@]}" --steps=10 --warmup=3 \
        --profile_dir="/tmp/electra_profile_$model"
    python3 benchmarks/profile_top_ops.py "/tmp/electra_profile_$model" 2>&1 \
        | tee "$out/profile_top_ops_$model.log"
    tar -czf "$out/${model}_profile.tgz" -C /tmp "electra_profile_$model" ;;
  parts)  # What row-keyed dropout, the exact AUC and the non-finite skip cost in the Small step
    # (dropout as the paper; apply_if_finite: optax's skip instead of optim.skip_if_nonfinite).
    # PARTS_CONFIG=base and PARTS_FLAGS choose others, e.g. what cuDNN's attention saves in Base:
    # PARTS_FLAGS='--config.train_batch_size=32 --config.attention_dropout_rate=0
    # --variants=as_trained,xla_attention' (two compiles of Base, about 3.5 min on an H200);
    # PARTS_FLAGS='--variants=as_trained,flat_optimizer': what the per-array optimizer and norm
    # kernels (~950 in Base's step, session 15) cost the Small step (two compiles, about 3 min);
    # PARTS_FLAGS='--variants=as_trained,f32_scores': what the bf16 attention scores save
    # (Base at 32 x 512 on an H200: 76.4 -> 73.3 ms); 'autodiff_softmax_backward' what the
    # model's softmax-dropout backward saves (Base: 71.6 against 69.5 ms). The five default
    # variants of Small at '--config.steps_per_execution=10' took 478 s on an H200 (2026-11-27,
    # compiles 47-84 s).
    read -ra extra <<< "${PARTS_FLAGS:-}"
    measure step_parts benchmarks/step_parts.py --config="configs/${PARTS_CONFIG:-small}.py" \
        "${extra[@]}" --steps=30 --rounds=3 ;;
  pretrain)  # ELECTRA-Small, paper recipe, bf16, on the bundled corpus; fits one 10-minute call.
    # PRETRAIN_STEPS sets the schedule (warmup a tenth of it); a run still going after
    # PRETRAIN_SECONDS gets SIGTERM, saves and stops (its metrics so far are kept). Back here:
    # python benchmarks/demo_recipe/plot_study.py OUT_DIR/pretrain.png small=OUT_DIR plots the
    # held-out AUC and MLM accuracy against tokens from the copied config and eval metrics.
    # PRETRAIN_FLAGS adds overrides, e.g. '--config.relative_attention_span=8' (the demo's
    # attention bias: the paper's network left the held-out AUC at 0.54 after 12,000 steps),
    # or '--config.steps_per_execution=100' (best a divisor of 100, 500 and PRETRAIN_STEPS): the
    # host's dispatch and CUDA-graph update once per 100 steps (2026-11-26, H100: 4 ms of
    # graph update and 12 ms of launch a step against 15 ms of kernels).
    # PRETRAIN_PROFILE_STEPS=FIRST:LAST (e.g. 1001:1003) traces those steps of the real loop
    # (input pipeline and gaps between steps included); the Perfetto JSON and
    # profile_top_ops' table come back (pretrain_profile.json.gz, pretrain_top_ops.log): with
    # the stage's other files that makes 8, the device tool's limit, so run it as the only stage.
    steps=${PRETRAIN_STEPS:-12000}
    read -ra extra <<< "${PRETRAIN_FLAGS:-}"
    workdir=/tmp/electra_small_pretrain
    # A new run each call: on a warm machine the last call's run would be resumed (or refused
    # for other shapes) and its metrics copied as this one's.
    rm -rf "$workdir"
    if [[ -n ${PRETRAIN_PROFILE_STEPS:-} ]]; then
      extra+=("--profile_dir=$workdir/profile" "--profile_steps=$PRETRAIN_PROFILE_STEPS")
    fi
    # --preserve-status: the train command's own status after SIGTERM (0 once it saved; a
    # failed save fails the stage); -k: KILL a run still there 60 s after, before the device
    # tool's 10-minute limit takes the whole call (and the files below).
    cached timeout --preserve-status -k 60 -s TERM "${PRETRAIN_SECONDS:-510}" \
        python3 -m electra_jax.train \
        --config=configs/small.py --workdir=$workdir --config.dtype=bfloat16 \
        --config.num_train_steps="$steps" --config.num_warmup_steps=$((steps / 10)) \
        --config.log_every_steps=100 --config.eval_every_steps=500 --config.num_eval_steps=0 \
        --config.save_checkpoints_steps="$steps" --config.progress_bar=false "${extra[@]}" \
        2>&1 | tee "$out/pretrain.log"
    # The stage's status is the train command's: 0 also when PRETRAIN_SECONDS' SIGTERM stopped
    # it (it saved); 143, TERM before training began (nothing to keep); 137, killed by -k.
    local rc=${PIPESTATUS[0]}
    if ((rc)); then echo "!! pretrain failed (exit $rc); see $out/pretrain.log" >&2; fi
    cp $workdir/metrics.jsonl $workdir/eval_metrics.jsonl $workdir/config.json "$out/"
    if [[ -n ${PRETRAIN_PROFILE_STEPS:-} ]]; then
      python3 benchmarks/profile_top_ops.py $workdir/profile 2>&1 | tee "$out/pretrain_top_ops.log"
      traces=("$workdir"/profile/plugins/profile/*/perfetto_trace.json.gz)  # Newest last.
      cp "${traces[-1]}" "$out/pretrain_profile.json.gz"
    fi
    return "$rc" ;;
esac
}

exit_status=0
for stage in "${stage_list[@]}"; do
  echo "==== stage $stage"
  run_stage "$stage" || exit_status=$?
done
# A failed benchmark does not stop the stage (the others still run) but fails it.
((failed)) && exit 1
exit "$exit_status"
