#!/usr/bin/env bash
# The GPU suite: one mode per command, on a Hopper GPU (H100, H200) with JAX for CUDA
# installed; packages the machine lacks can come as wheels in .whl/ (benchmarks/README.md).
# Everything lands in $OUT (default /tmp/rhhjax_gpu_suite), beside versions.txt; the command
# exits non-zero when a test, a row or the training failed.
#
#   bash benchmarks/gpu_suite.sh test     # the compiled Mosaic GPU tests; tests.log ends "N passed",
#                                         # failures.log holds each failure; all passed: gpu_tested.json
#   bash benchmarks/gpu_suite.sh tune     # every persistent variant's paper bf16 step: autotune.json,
#                                         # its table ending "winner paper bfloat16: ..."
#   BATCHES=256,512 bash benchmarks/gpu_suite.sh bench  # the paper step of fused and persistent
#                                         # in bf16 per batch: bench_b<B>.json, a table per batch
#   bash benchmarks/gpu_suite.sh profile  # the paper bf16 step traced: profile_summary.md (time per
#                                         # kernel), the traces in profile.tar.gz
#   TRAIN_MINUTES=8 bash benchmarks/gpu_suite.sh train  # configs/ptb.py:fast on .data/ptb:
#                                         # train.tar.gz (log, metrics, results, samples),
#                                         # params_*.npy, autotune_cache.json
#   bash benchmarks/gpu_suite.sh dry-run  # on a CPU, every mode at the small size in minutes
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODE=${1:-}
case "$MODE" in
  test | tune | bench | profile | train | dry-run) ;;
  *)
    echo "usage: bash benchmarks/gpu_suite.sh test|tune|bench|profile|train|dry-run" >&2
    exit 2
    ;;
esac
OUT=${OUT:-/tmp/rhhjax_gpu_suite}
mkdir -p "$OUT"
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
# XLA's default level 3, not the level 0 that conftest.py sets for the tests on a CPU
export XLA_FLAGS=${XLA_FLAGS:---xla_backend_optimization_level=3}
status=0

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git log -1 --format='commit %H %s' 2> /dev/null || true
  "$PY" -c "import sys, jax, jaxlib, flax, optax
print('python', sys.version.split()[0]); print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)
print('flax', flax.__version__, 'optax', optax.__version__)
print('backend', jax.default_backend(), jax.devices())" || status=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2> /dev/null || true
} 2>&1 | tee "$OUT/versions.txt"

# The Mosaic GPU files: their Compiled / OnAGpu classes run only on a GPU.
TESTS=(tests/test_ops_mosaic.py tests/test_ops_persistent.py tests/test_ops_persistent_batch.py
  tests/test_kernels_mosaic_*.py)

run_test() {  # the GPU-only classes, each failure appended to failures.log as it happens
  rm -f "$OUT/failures.log"
  RHHJAX_FAILURE_LOG="$OUT/failures.log" "$PY" -m pytest -v -p no:cacheprovider \
    -n "${WORKERS:-4}" --dist load -k "Compiled or OnAGpu" "${TESTS[@]}" 2>&1 \
    | tee "$OUT/tests.log" | grep -E "FAILED|ERROR|passed|failed|skipped"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    status=1
  elif [ "$MODE" = test ]; then  # every test passed: commit gpu_tested.json to results/
    device=$("$PY" -c "import jax; print(jax.devices()[0].device_kind)")
    "$PY" benchmarks/kernel_source.py record "$OUT/gpu_tested.json" \
      --tests_log="$OUT/tests.log" --device="$device" || status=1
  fi
}

run_tune() {  # run_tune ARGS...: autotune_persistent.py's table
  "$PY" benchmarks/autotune_persistent.py --dtypes=bfloat16 --out="$OUT/autotune.json" "$@" \
    2>&1 | tee "$OUT/autotune.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

run_bench() {  # run_bench ARGS...: bench.py's step rows, once per batch of BATCHES
  local batch
  for batch in ${BATCHES//,/ }; do  # a comma-separated list
    "$PY" benchmarks/bench.py --parts=step --batch="$batch" "$@" \
      --out="$OUT/bench_b$batch.json" 2>&1 | tee -a "$OUT/bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
}

run_profile() {  # run_profile ARGS...: bench.py's rows traced, summed per kernel, archived
  rm -rf "$OUT/profile"
  "$PY" benchmarks/bench.py --parts=step --profile_dir="$OUT/profile" "$@" 2>&1 \
    | tee "$OUT/profile.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  "$PY" benchmarks/profile_summary.py "$OUT/profile" --steps 2 \
    --json "$OUT/profile_summary.json" > "$OUT/profile_summary.md" || status=1
  tar -C "$OUT" -czf "$OUT/profile.tar.gz" profile && rm -rf "$OUT/profile"
}

run_train() {  # run_train WORKDIR ARGS...: train.py with ARGS, samples, the parameters
  # The trainer's autotune (model.impl=auto) reads its winner from the committed cache when
  # the kernels are the ones that passed their compiled tests; otherwise it times as usual.
  local workdir=$1 cache=${RHHJAX_CACHE:-$HOME/.cache/rhhjax} temperature f
  shift
  export RHHJAX_CACHE=$cache
  mkdir -p "$cache" "$OUT/run"
  if "$PY" benchmarks/kernel_source.py check results/gpu_tested.json \
    && [ -f results/autotune_cache.json ]; then
    "$PY" - results/autotune_cache.json "$cache/autotune.json" << 'EOF' || status=1
import json, os, sys
committed, path = (json.load(open(sys.argv[1])), sys.argv[2])
mine = json.load(open(path)) if os.path.exists(path) else {}
json.dump({**mine, **committed}, open(path, "w"), indent=1)
EOF
  fi
  "$PY" train.py --workdir="$workdir" "$@" 2>&1 | tee "$OUT/run/train.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  for temperature in 0.5 0.8 1.0; do
    "$PY" -m rhhjax.tools.sample --workdir="$workdir" --prompt="the " --length=400 \
      --temperature="$temperature" --output="$OUT/run/sample_t$temperature.txt" || status=1
  done
  for f in config.json metrics.jsonl results.json; do
    [ -f "$workdir/$f" ] && cp "$workdir/$f" "$OUT/run/"
  done
  [ -f "$cache/autotune.json" ] && cp "$cache/autotune.json" "$OUT/autotune_cache.json"
  # The parameters as 4 float32 files beside one archive of the rest: 8 files at most.
  "$PY" benchmarks/params_files.py export "$workdir" "$OUT/run" --parts=4 || status=1
  mv "$OUT"/run/params_*.npy "$OUT/" 2> /dev/null
  tar -C "$OUT/run" -czf "$OUT/train.tar.gz" . && rm -rf "$OUT/run"
  tail -14 < <(tar -xzOf "$OUT/train.tar.gz" ./train.log)
}

# shellcheck disable=SC2054  # commas inside an option
PAPER=(--sizes=paper --models=hyperrhn --impls=fused,persistent --dtypes=bfloat16)
case "$MODE" in
  test) run_test ;;
  tune) run_tune --sizes=paper --compile_workers=4 ;;
  bench) BATCHES=${BATCHES:-256} run_bench "${PAPER[@]}" --repeats=10 ;;
  profile) run_profile "${PAPER[@]}" --repeats=5 ;;
  train)
    WORKDIR=${TRAIN_WORKDIR:-/tmp/rhhjax_train/ptb_fast}
    mkdir -p "$(dirname "$WORKDIR")"
    run_train "$WORKDIR" --config=configs/ptb.py:fast --config.data.dir="${PTB_DIR:-.data/ptb}" \
      --config.data.download=False --config.train.budget_minutes="${TRAIN_MINUTES:-8}"
    ;;
  dry-run)  # every mode on a CPU at the small size: the GPU-only tests skip, the autotune lists
    WORKERS=${WORKERS:-2} run_test
    run_tune --sizes=small --list
    # shellcheck disable=SC2054
    SMALL=(--sizes=small --models=rhn --impls=scan,fused --dtypes=float32 --repeats=1)
    BATCHES=8,16 run_bench "${SMALL[@]}"
    run_profile "${SMALL[@]}" --impls=fused
    cat README.md docs/*.md > "$OUT/text.txt"  # a small corpus in place of PTB
    rm -rf "$OUT/dry_run" "$OUT/cache"
    RHHJAX_CACHE="$OUT/cache" run_train "$OUT/dry_run" --config=configs/ptb.py:tiny --config.data.format=text \
      --config.data.text_files="$OUT/text.txt" --config.data.hutter_holdout=3000
    ;;
esac
echo "gpu_suite $MODE: status $status"
exit "$status"
