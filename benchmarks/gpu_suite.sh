#!/usr/bin/env bash
# GPU suite: versions, compiled kernel + equivalence tests, paper-size benchmark.
#
# Runs in one call of at most 10 minutes on a GPU machine with JAX preinstalled and no
# network (the device tool's H100 / H200). It never installs JAX. Packages the machine
# lacks (ml_collections) travel as wheels in .whl/ (see README, "On a GPU"):
#
#   pip download --no-deps --only-binary=:all: -d .whl ml_collections
#   bash benchmarks/gpu_suite.sh            # with .whl carried to the machine
#
# Writes versions.txt, tests.log, bench.log and bench.json under $OUT (default
# /tmp/rhhjax_gpu_suite). Exits non-zero if the tests or the benchmark fail.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rhhjax_gpu_suite}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/rhhjax_site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/rhhjax_site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
status=0

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  "$PY" -c "import sys, jax, jaxlib, flax, optax, orbax.checkpoint as ocp, ml_collections
print('python', sys.version.split()[0]); print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)
print('flax', flax.__version__, 'optax', optax.__version__, 'orbax', ocp.__version__)
print('backend', jax.default_backend(), jax.devices())"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
} 2>&1 | tee "$OUT/versions.txt"

# On a GPU, `pallas` resolves to compiled Triton kernels (interpret only off GPU), and
# the GPU-only kernel tests run instead of skipping.
timeout 270 "$PY" -m pytest -q -p no:cacheprovider -x \
  tests/test_kernels_config.py tests/test_kernels_padded.py tests/test_kernels_legacy.py tests/test_kernels_stacked.py tests/test_recurrence.py 2>&1 | tee "$OUT/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

timeout 270 "$PY" -m rhhjax.bench --sizes=paper --dtypes=bfloat16,float32 --repeats=10 \
  --out="$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
