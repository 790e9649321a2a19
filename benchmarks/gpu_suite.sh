#!/usr/bin/env bash
# GPU suite: versions, compiled kernel and equivalence tests, paper-size benchmark beside the
# compile report's prediction. For a GPU machine with JAX preinstalled and no network (the
# device tool's H100 / H200); it never installs JAX. Packages the machine lacks travel as
# wheels in .whl/ (see benchmarks/README.md, "On a GPU"):
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl ml_collections
#   bash benchmarks/gpu_suite.sh tests     # compiled tests (about 5 min on an H100)
#   bash benchmarks/gpu_suite.sh bench     # paper-size step of every impl x model x dtype, rank-d
#                                          # rows, GEMM-loop rates, phase latencies, command buffers
#   bash benchmarks/gpu_suite.sh all       # both (over one 10-minute device command)
#   bash benchmarks/gpu_suite.sh persistent # the persistent and mosaic kernels: their compiled
#                                          # tests, then their paper-size HyperRHN step beside fused
#   bash benchmarks/gpu_suite.sh calibrate # < 2 min: grid barrier alone at the real grid, one
#                                          # forward and one backward phase at the chosen plan,
#                                          # the L2 rate (benchmarks/calibrate_persistent.py);
#                                          # the refitted Rates' prediction table
#   bash benchmarks/gpu_suite.sh train     # the paper model on PTB for TRAIN_MINUTES of training in
#                                          # all, resumable: repeat the same command until
#                                          # $OUT/train_status says finished (below)
#   bash benchmarks/gpu_suite.sh lease     # a 15-minute lease in one 10-minute call: the
#                                          # persistent tests, calibrate, the persistent and
#                                          # fused step rows, then train with the rest
#   bash benchmarks/gpu_suite.sh kernels   # a lease in one call for the kernels alone: barrier,
#                                          # persistent vs scan, paper steps (bf16 traced),
#                                          # calibrate (3 pipelines), tests
#   bash benchmarks/gpu_suite.sh fast      # a loan's training call: configs/ptb.py:fast for
#                                          # FAST_MINUTES (7) with FAST_IMPL (fused), every
#                                          # protocol, samples, the parameters as 4 files
#   bash benchmarks/gpu_suite.sh check     # a loan's first call (timeout 220 s): the persistent
#                                          # model's compiled tests, the autotune table (bf16,
#                                          # paper; AUTOTUNE_SKIP / _WITH / _ONLY: --skip /
#                                          # --with / --only); prints the `fast` call with
#                                          # its impl and variant
#   bash benchmarks/gpu_suite.sh autotune  # a loan's call (timeout 200 s): every persistent
#                                          # variant's paper bf16 step in one process, timed;
#                                          # $OUT/autotune.json and its table, the winner named
#   bash benchmarks/gpu_suite.sh row ARGS  # one bench.py call with ARGS (a lease's follow-up
#                                          # call; --profile_dir=$OUT/profile: one archive)
#   bash benchmarks/gpu_suite.sh dry-run   # on a CPU: every step at the small size
#
# Writes versions.txt, tests.log, bench.log, bench_<part>.json, bench.json (all parts merged)
# and bench_vs_report.md under $OUT (default /tmp/rhhjax_gpu_suite). Exits non-zero if a test
# or a benchmark row fails. Each bench part has its own time limit (bench mode: 590 s in all)
# and writes its JSON after every row, so a cut part keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
OUT=${OUT:-/tmp/rhhjax_gpu_suite}
mkdir -p "$OUT"
rm -f /tmp/rhhjax_profile.tar.gz  # no earlier call's traces (see `traces`)
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/rhhjax_site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/rhhjax_site:${PYTHONPATH:-}
fi
# Without an install, rhhjax.kernels and rhhjax.configs (kernels/ and configs/, mapped by
# pyproject's package-dir) are reached through links in this copy of the tree.
if ! "$PY" -c "import rhhjax.kernels, rhhjax.configs" 2> /dev/null; then
  [ -e rhhjax/kernels ] || ln -s ../kernels rhhjax/kernels
  [ -e rhhjax/configs ] || ln -s ../configs rhhjax/configs
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# XLA default level 3, not the level 0 that conftest.py sets for the tests on a CPU
export XLA_FLAGS=${XLA_FLAGS:---xla_backend_optimization_level=3}
status=0

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git log -1 --format='commit %H %s' 2> /dev/null || true
  "$PY" -c "import sys, jax, jaxlib, flax, optax, orbax.checkpoint as ocp, ml_collections
print('python', sys.version.split()[0]); print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)
print('flax', flax.__version__, 'optax', optax.__version__)
print('backend', jax.default_backend(), jax.devices())" || status=1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
    --format=csv 2> /dev/null || true
} 2>&1 | tee "$OUT/versions.txt"

TESTS="tests/test_ops_recurrence.py tests/test_ops_lowrank.py
  tests/test_models_cores.py tests/test_train_step.py
  tests/test_ops_mosaic.py tests/test_kernels_mosaic_forward.py
  tests/test_kernels_mosaic_backward.py tests/test_kernels_mosaic_grid_barrier.py
  tests/test_ops_persistent.py tests/test_kernels_mosaic_persistent_forward.py
  tests/test_kernels_mosaic_persistent_forward_run.py
  tests/test_kernels_mosaic_persistent_backward.py
  tests/test_kernels_mosaic_persistent_backward_run.py tests/test_kernels_mosaic_rowgroup_layout.py"
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  # On a GPU, `mosaic` and `persistent` compile their Mosaic GPU kernels and the GPU-only
  # tests run.
  # shellcheck disable=SC2086
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider -n 6 --dist loadfile $TESTS 2>&1 \
    | tee "$OUT/tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

part() {  # part NAME SECONDS ARGS...: one bench.py invocation -> $OUT/bench_NAME.json
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" "$PY" benchmarks/bench.py "$@" --out="$OUT/bench_$name.json" 2>&1 \
    | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
gpu_tests() {  # gpu_tests SECONDS LOG [PYTEST OPTIONS] FILES...: the GPU-only test classes
  local seconds=$1 log=$2  # (the rest runs in CI), each failure logged as it happens
  shift 2
  RHHJAX_FAILURE_LOG="$OUT/failures.log" timeout "$seconds" "$PY" -m pytest -v \
    -p no:cacheprovider -n 4 --dist load -k "Compiled or OnAGpu" "$@" 2>&1 \
    | tee "$OUT/$log" | grep -E "FAILED|ERROR|Error|passed|failed|Timeout"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
calibrate() {  # calibrate NAME SECONDS [ARGS]: calibrate_persistent.py -> $OUT/NAME.{json,log}
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" "$PY" benchmarks/calibrate_persistent.py "$@" --out "$OUT/$name.json" \
    2>&1 | tee "$OUT/$name.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
autotune_table() {  # autotune_table SECONDS BUDGET DTYPES: autotune_persistent.py's table of
  timeout "$1" "$PY" benchmarks/autotune_persistent.py --sizes="${BENCH_SIZES:-paper}" \
    --dtypes="$3" --budget="$2" --limit=60 --compile_workers=4 --out="$OUT/autotune.json" \
    ${AUTOTUNE_SKIP:+--skip="$AUTOTUNE_SKIP"} ${AUTOTUNE_WITH:+--with="$AUTOTUNE_WITH"} \
    ${AUTOTUNE_ONLY:+--only="$AUTOTUNE_ONLY"} 2>&1 \
    | tee "$OUT/autotune.log"  # every persistent variant -> $OUT/autotune.{json,log}
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
traces() {  # $OUT/profile (bench.py --profile_dir) -> its summary; the traces travel apart,
  [ -d "$OUT/profile" ] || return 0  # as $OUT/profile.tar.gz at the end
  "$PY" benchmarks/profile_summary.py "$OUT/profile" --steps 2 \
    --json "$OUT/profile_summary.json" > "$OUT/profile_summary.md" 2>&1 || status=1
  tar -C "$OUT" -czf /tmp/rhhjax_profile.tar.gz profile && rm -rf "$OUT/profile"
}
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  # paper-size step of every impl x model (rank 0), with the GEMM-loop rates of the dtype
  part bfloat16 150 --sizes=paper --dtypes=bfloat16 --parts=gemm,step --repeats=10
  part float32 130 --sizes=paper --dtypes=float32 --parts=gemm,step --repeats=10
  # rank-d HyperRHN (every impl that supports a rank: scan, fused): step time and memory
  part ranks 110 --sizes=paper --models=hyperrhn --ranks=1,4 --impls=scan,fused \
    --dtypes=bfloat16,float32 --repeats=5
  # phase latency: one micro-layer (GEMM + gates) per impl, forward at depths 2 and 6
  part phase 120 --sizes=paper --parts=phase --ranks=0,1,4 --dtypes=bfloat16 --repeats=5
  # command buffers (CUDA graphs): fused with the time loops as graphs, and with none
  part cmdbuf_while 40 --sizes=paper --impls=fused --dtypes=bfloat16 --command_buffer=while \
    --repeats=10
  part cmdbuf_off 40 --sizes=paper --impls=fused --dtypes=bfloat16 --command_buffer=off \
    --repeats=10
fi
if [ "$MODE" = persistent ]; then  # the persistent kernels' tests on a GPU
  # shellcheck disable=SC2086
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
    tests/test_kernels_mosaic_grid_barrier.py tests/test_ops_persistent.py \
    tests/test_kernels_mosaic_persistent_forward.py \
    tests/test_kernels_mosaic_persistent_forward_run.py \
    tests/test_kernels_mosaic_persistent_backward.py \
    tests/test_kernels_mosaic_persistent_backward_run.py \
    tests/test_kernels_mosaic_rowgroup_layout.py 2>&1 | tee "$OUT/tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  part persistent 300 --sizes=paper --models=hyperrhn --impls=fused,mosaic,persistent \
    --dtypes=bfloat16,float32 --parts=step --repeats=10
fi
if [ "$MODE" = lease ]; then
  # A 15-minute lease in one call of LEASE_SECONDS (570): the persistent kernels' compiled
  # tests (90 s), the calibration (60 s), the paper-size HyperRHN step of persistent and fused
  # (110 s), then the paper model trained with the rest (fused, bf16) so that training and
  # its final evaluation end inside the call; everything comes back as $OUT/lease.tar.gz.
  lease=${LEASE_SECONDS:-570}
  gpu_tests 90 tests.log --dist loadfile tests/test_kernels_mosaic_grid_barrier.py \
    tests/test_ops_persistent.py tests/test_kernels_mosaic_persistent_forward.py \
    tests/test_kernels_mosaic_persistent_forward_run.py \
    tests/test_kernels_mosaic_persistent_backward.py \
    tests/test_kernels_mosaic_persistent_backward_run.py \
    tests/test_kernels_mosaic_rowgroup_layout.py
  calibrate calibrate 60
  part persistent 110 --sizes="${BENCH_SIZES:-paper}" --models=hyperrhn \
    --impls=persistent,fused --dtypes=bfloat16,float32 --parts=step --repeats=10
  left=$((lease - SECONDS))
  if [ "$left" -ge 240 ]; then  # 180 s of it: start, validations, final evaluation
    TRAIN_CALL_SECONDS=$((left - 5))
    TRAIN_MINUTES=${TRAIN_MINUTES:-$(((left - 180) / 6))e-1}
    MODE=train
    echo "lease: ${left} s left for training, max_minutes ${TRAIN_MINUTES}"
  else
    echo "lease: ${left} s left, too little for training"
  fi
  LEASE=1
fi
if [ "$MODE" = kernels ]; then
  # A lease spent on the kernels alone, in one call of about 590 s: the grid barrier on a GPU,
  # the persistent model against scan, the paper-size HyperRHN step of persistent and fused
  # in bf16 (each traced for 2 more steps: $OUT/profile_summary.md, the traces apart in
  # $OUT/profile.tar.gz), persistent's at half the length (the step's part that scales with
  # it), the calibration at the chosen plan and at two other pipelines (below), then the
  # persistent kernels' compiled tests with the time left; everything else comes back as
  # $OUT/lease.tar.gz.
  lease=${LEASE_SECONDS:-570}
  gpu_tests 40 tests_barrier.log tests/test_kernels_mosaic_grid_barrier.py
  gpu_tests 120 tests_ops.log tests/test_ops_persistent.py
  sizes=(--sizes="${BENCH_SIZES:-paper}" --models=hyperrhn --parts=step --repeats=10)
  part step_bf16 120 "${sizes[@]}" --impls=persistent,fused --dtypes=bfloat16 \
    --profile_dir="$OUT/profile" --profile_steps=2
  part step_bf16_half 50 "${sizes[@]}" --impls=persistent --dtypes=bfloat16 --seq_len=50
  traces  # apart from the lease's archive, which stays small
  # the chosen plan (3 stages of 64 in bf16), 2 stages, 6 of 32
  # (the same shared memory, more loads in flight): is a phase bound by its pipeline's depth?
  for pipeline in 0x0 2x0 6x32; do
    calibrate "calibrate_$pipeline" 60 --stages "${pipeline%x*}" --k-chunk "${pipeline#*x}"
  done
  left=$((lease - SECONDS))
  if [ "$left" -ge 20 ]; then
    # the persistent kernels' (mosaic's passed every compiled test on 2026-11-26)
    gpu_tests "$left" tests_kernels.log tests/test_kernels_mosaic_persistent_forward.py \
      tests/test_kernels_mosaic_persistent_forward_run.py \
      tests/test_kernels_mosaic_persistent_backward.py \
      tests/test_kernels_mosaic_persistent_backward_run.py \
      tests/test_kernels_mosaic_rowgroup_layout.py
  fi
  LEASE=1
fi
if [ "$MODE" = check ]; then
  # A loan's first call (../shared/docs/gpu-lease.md, timeout 220 s): the persistent model's
  # compiled tests against `scan`, in the row-group layout too (21 tests in at most 130 s, 10
  # at once; 12 took 75 s 8 at once in results/gpu_h200_2026-11-28b.md), and at the same
  # time, apart (4 at once), those of the variant fields no GPU has tested
  # (`persistent.UNTESTED_ON_A_GPU`: a hang there cuts only them, and the autotune leaves out
  # a field whose tests did not all pass); then the autotune table of the paper-size bf16
  # HyperRHN step with the rest: today's variant and its levers first (`persistent.LEVERS`),
  # after the first 4 compiling at once (threads);
  # AUTOTUNE_SKIP=an earlier autotune.json leaves out what it timed, but its winner and the
  # default; AUTOTUNE_WITH=status=poison sets that in every candidate but the default;
  # AUTOTUNE_ONLY=layout=rowgroup keeps the default and the candidates with it. Writes
  # fast_impl and fast_variant for `fast`: persistent and the winner if every model test
  # passed, else fused.
  untested=$("$PY" benchmarks/autotune_persistent.py --untested_k)
  if [ -n "$untested" ]; then
    gpu_tests 130 tests_untested.log -n 4 -k "$untested" tests/test_ops_persistent.py &
    gpu_tests 130 tests_model.log -n 10 -k "(Compiled or OnAGpu) and not ($untested)" \
      tests/test_ops_persistent.py
    wait
    guard=$("$PY" benchmarks/autotune_persistent.py --untested_guard="$OUT/tests_untested.log")
    AUTOTUNE_ONLY="${AUTOTUNE_ONLY:-}${guard:+${AUTOTUNE_ONLY:+,}$guard}"
  else
    gpu_tests 130 tests_model.log -n 10 tests/test_ops_persistent.py
  fi
  left=$((${CHECK_SECONDS:-205} - SECONDS))  # the autotune gets what the tests left
  autotune_table "$left" $((left - 15)) bfloat16
  read -r fast_impl fast_variant < <("$PY" benchmarks/autotune_persistent.py \
    --next_call="$OUT/tests_model.log" --out="$OUT/autotune.json" || echo fused default)
  echo "$fast_impl" > "$OUT/fast_impl"
  echo "$fast_variant" > "$OUT/fast_variant"
  echo "next: FAST_IMPL=$fast_impl FAST_VARIANT='$fast_variant' bash benchmarks/gpu_suite.sh fast"
  LEASE=1
fi
if [ "$MODE" = row ]; then
  # One bench.py call with the arguments after "row" (a lease's follow-up call, set up like
  # the others); with --profile_dir=$OUT/profile its traces come back as one archive.
  shift
  part row 570 "$@"
  traces
fi
if [ "$MODE" = calibrate ]; then  # the plan model's three assumed rates, measured; < 2 min
  calibrate calibrate 110
  if [ -f "$OUT/calibrate.json" ]; then
    "$PY" benchmarks/persistent_prediction.py --calibration "$OUT/calibrate.json" \
      --json "$OUT/prediction_calibrated.json" | tee "$OUT/prediction_calibrated.md" || status=1
  fi
fi
if [ "$MODE" = autotune ]; then  # every persistent variant timed (autotune_persistent.py)
  autotune_table "${AUTOTUNE_SECONDS:-190}" "${AUTOTUNE_BUDGET:-165}" \
    "${AUTOTUNE_DTYPES:-bfloat16}"
fi
if [ "$MODE" = train ]; then
  # A device command lasts at most 10 minutes, so the run is cut into calls: each trains
  # until TRAIN_CALL_SECONDS (SIGTERM: the trainer checkpoints and exits), the next call
  # resumes the same workdir (kept on the machine while it stays warm) until
  # train.max_minutes of training in all, then the final evaluation. PTB comes from
  # RHHJAX_PTB_DIR (default .data/ptb: an ignored folder the session carries; no network).
  WORKDIR=${TRAIN_WORKDIR:-/tmp/rhhjax_train/ptb_paper}
  mkdir -p "$(dirname "$WORKDIR")"
  # shellcheck disable=SC2086
  timeout --signal=TERM "${TRAIN_CALL_SECONDS:-540}" "$PY" train.py \
    --config="${TRAIN_CONFIG:-configs/ptb.py}" --workdir="$WORKDIR" \
    --config.data.dir="${RHHJAX_PTB_DIR:-.data/ptb}" --config.data.download=False \
    --config.model.dtype="${TRAIN_DTYPE:-bfloat16}" \
    --config.train.max_minutes="${TRAIN_MINUTES:-17}" ${TRAIN_ARGS:-} 2>&1 | tee -a "$OUT/train.log"
  code=${PIPESTATUS[0]}
  for f in config.json metrics.jsonl results.json; do
    [ -f "$WORKDIR/$f" ] && cp "$WORKDIR/$f" "$OUT/"
  done
  if [ -f "$WORKDIR/results.json" ]; then
    echo finished > "$OUT/train_status"
  elif [ "$code" -eq 143 ] || [ "$code" -eq 124 ]; then
    echo "stopped by the call's time limit: run the same command again to resume" \
      > "$OUT/train_status"
  else
    echo "failed (exit $code): see train.log" > "$OUT/train_status"
    status=1
  fi
  cat "$OUT/train_status"
fi
if [ "$MODE" = fast ]; then
  # The loan's training call (../shared/docs/gpu-lease.md, call 2, timeout 540 s): the
  # time-budgeted recipe in bf16 with the fastest implementation that passed its compiled
  # tests in call 1, its final evaluation under every protocol, three samples and the best
  # parameters as float32 files of < 16 MiB; the rest comes back as $OUT/fast.tar.gz.
  WORKDIR=${TRAIN_WORKDIR:-/tmp/rhhjax_train/ptb_fast}
  mkdir -p "$(dirname "$WORKDIR")" "$OUT/run"
  # shellcheck disable=SC2086
  timeout --signal=TERM "${TRAIN_CALL_SECONDS:-480}" "$PY" train.py \
    --config="${TRAIN_CONFIG:-configs/ptb.py:fast}" --workdir="$WORKDIR" \
    --config.data.dir="${RHHJAX_PTB_DIR:-.data/ptb}" --config.data.download=False \
    --config.model.dtype="${TRAIN_DTYPE:-bfloat16}" --config.model.impl="${FAST_IMPL:-fused}" \
    --config.model.persistent_variant="${FAST_VARIANT:-default}" \
    --config.train.budget_minutes="${FAST_MINUTES:-7}" ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/run/train.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  for temperature in 0.5 0.8 1.0; do
    timeout 30 "$PY" -m rhhjax.tools.sample --workdir="$WORKDIR" --prompt="the " --length=400 \
      --temperature=$temperature --output="$OUT/run/sample_t$temperature.txt" || status=1
  done
  for f in config.json metrics.jsonl results.json; do
    [ -f "$WORKDIR/$f" ] && cp "$WORKDIR/$f" "$OUT/run/"
  done
  timeout 60 "$PY" benchmarks/params_files.py export "$WORKDIR" "$OUT/run" --parts=4 || status=1
  mv "$OUT"/run/params_*.npy "$OUT/" 2> /dev/null
  tar -C "$OUT/run" -czf "$OUT/fast.tar.gz" . && rm -rf "$OUT/run"
  tail -14 < <(tar -xzOf "$OUT/fast.tar.gz" ./train.log)
fi
if [ "$MODE" = dry-run ]; then  # the CPU rehearsal: same steps, small and fast
  # shellcheck disable=SC2086
  timeout 600 "$PY" -m pytest -q -p no:cacheprovider -x \
    tests/test_kernels_layout.py tests/test_train_step.py 2>&1 | tee "$OUT/tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  small=(--sizes=small --models=rhn --repeats=1 --square=128 --gemm_iters=2)
  part float32 280 "${small[@]}" --dtypes=float32 --impls=scan --parts=gemm,step
  part ranks 280 --sizes=small --models=hyperrhn --ranks=1 --impls=scan \
    --dtypes=float32 --repeats=1
  part phase 280 "${small[@]}" --dtypes=float32 --impls=scan,fused --parts=phase \
    --phase_depths=1,2
  part cmdbuf_while 280 "${small[@]}" --dtypes=float32 --impls=fused --command_buffer=while
  part cmdbuf_off 280 "${small[@]}" --dtypes=float32 --impls=fused --command_buffer=off
fi
"$PY" - "$OUT" << 'PYEOF'
import glob, json, sys
out = sys.argv[1]
parts = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/bench_*.json"))]
if parts:
    merged = dict(parts[0], rows=[r for p in parts for r in p["rows"]],
                  gemm_rows=[r for p in parts for r in p.get("gemm_rows", [])],
                  phase_rows=[r for p in parts for r in p.get("phase_rows", [])],
                  failed=[r for p in parts for r in p.get("failed", [])],
                  commands=[p["command"] for p in parts],
                  xla_flags=[p.get("xla_flags", "") for p in parts])
    merged.pop("command")
    json.dump(merged, open(f"{out}/bench.json", "w"), indent=1)
PYEOF
if [ -f "$OUT/bench.json" ]; then
  "$PY" benchmarks/bench_vs_report.py "$OUT/bench.json" --report=results/gpu_report_h100.json \
    | tee "$OUT/bench_vs_report.md" || status=1
fi
if [ -n "${LEASE:-}" ]; then  # at most 8 files come back from a device call: one archive
  tar -C "$OUT" -czf /tmp/lease.tar.gz . && rm -rf "${OUT:?}"/* && mv /tmp/lease.tar.gz "$OUT/"
  echo "== lease summary"
  for log in tests tests_model tests_barrier tests_ops tests_kernels; do
    tar -xzOf "$OUT/lease.tar.gz" "./$log.log" 2> /dev/null | tail -1
  done
  tar -xzOf "$OUT/lease.tar.gz" ./failures.log 2> /dev/null | grep -E "^(====|E )" | head -30
  for log in calibrate calibrate_0x0 calibrate_2x0 calibrate_6x32; do  # the measured figures
    line=$(tar -xzOf "$OUT/lease.tar.gz" "./$log.log" 2> /dev/null |
      grep -E '"(k_chunk|stages|barrier_us|fwd_phase_us|bwd_phase_us)"' | head -5 | tr -d '\n')
    [ -z "$line" ] || echo "$log:$line"
  done
  tar -xzOf "$OUT/lease.tar.gz" ./bench.log 2> /dev/null | grep -A8 "^impl "
  tar -xzOf "$OUT/lease.tar.gz" ./autotune.log 2> /dev/null | grep -E "^\||^winner"
  tar -xzOf "$OUT/lease.tar.gz" ./train.log 2> /dev/null | tail -14
fi
if [ -f /tmp/rhhjax_profile.tar.gz ]; then  # `traces`; at most 16 MiB comes back per file
  if [ "$(stat -c %s /tmp/rhhjax_profile.tar.gz)" -gt 16000000 ]; then
    echo "the traces are over 16 MB: left on the machine in /tmp/rhhjax_profile.tar.gz"
  else
    mv /tmp/rhhjax_profile.tar.gz "$OUT/profile.tar.gz"
  fi
fi
echo "gpu_suite $MODE: status $status"
exit $status
