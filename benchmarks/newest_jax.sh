#!/usr/bin/env bash
# Newest-JAX check, a step of .ci/run: build (or reuse) a Python 3.12 venv with the newest jax
# release on PyPI and run the ops, kernel, model, train-step and checkpoint tests under it on
# the CPU (their CUDA-lowering tests included: those lower for "cuda" without a GPU). Where
# that jax has GPU interpret mode (>= 0.11.2) this is where the Mosaic GPU kernels execute:
# the TestInterpret classes of tests/test_kernels_mosaic_*.py, test_ops_mosaic.py and
# test_ops_persistent.py run the real kernels against their references with the race detector
# on (tests/conftest.py sizes XLA's CPU pool with NPROC=17 for their clusters of 16 blocks).
#
#   bash benchmarks/newest_jax.sh                        # the newest jax, as CI runs it
#   bash benchmarks/newest_jax.sh 0.11.2 [PYTHON] [VENV] # a given release (or JAX_VERSION=...)
#
# Environment (all optional):
#   JAX_VERSION   the release to test; default: the newest that pip finds for PYTHON
#   PYTHON        the interpreter of the venv; default: the newest pyenv 3.12.x
#                 ($(pyenv root)/versions/3.12.*/bin/python), else python3.12 on PATH.
#                 jax >= 0.11 needs Python >= 3.11, 0.12 needs >= 3.12.
#   VENV          default build/venv-jax-newest (git-ignored). A venv that already has
#                 JAX_VERSION and imports rhhjax from this checkout is reused as it is; otherwise
#                 jax is installed into it at that version (pip picks the flax, optax and orbax
#                 releases that go with it). Delete the folder to rebuild from scratch.
#   SKIP_WITHOUT_PYTHON=1   no Python 3.12 on this machine: print one SKIPPED line, exit 0
#                 (without it: exit 2).
#   PYTEST_ARGS   extra pytest arguments (e.g. "-x -k lower"); WORKERS pytest-xdist workers
#                 (default auto: one per core).
#   COMMIT=<ref>  test that commit (a `git archive` export in /tmp/rhhjax-<sha>) instead of the
#                 working tree.
# Prints the resolved versions, pytest's summary and the step's wall time; exits with pytest's
# status (1 when the venv cannot be built, 2 for bad arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$SECONDS
JAX_VERSION=${1:-${JAX_VERSION:-}}
PYTHON=${2:-${PYTHON:-}}
VENV=${3:-${VENV:-}}
say() { echo "newest_jax.sh: $*" >&2; }

# -- the interpreter
if [[ -z $PYTHON ]]; then
  ROOT=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  PYTHON=$(ls -d "$ROOT"/versions/3.12.*/bin/python 2>/dev/null | sort -V | tail -1 || true)
  [[ -n $PYTHON ]] || PYTHON=$(command -v python3.12 || true)
fi
if [[ -z $PYTHON || ! -x $PYTHON ]]; then
  if [[ ${SKIP_WITHOUT_PYTHON:-0} == 1 ]]; then
    echo "== newest jax: SKIPPED: no Python 3.12 here (pyenv versions / python3.12; set PYTHON)"
    exit 0
  fi
  say "no Python 3.12 found (pyenv versions, python3.12 on PATH): set PYTHON"
  exit 2
fi

# -- the release
if [[ -z $JAX_VERSION ]]; then
  # pip's warnings about the machine's empty local index folders are noise here.
  JAX_VERSION=$("$PYTHON" -m pip index versions jax 2>/dev/null | sed -n 's/^jax (\(.*\))$/\1/p')
  if [[ -z $JAX_VERSION ]]; then
    say "cannot ask PyPI for the newest jax (offline?): set JAX_VERSION"
    exit 1
  fi
fi
if [[ ! $JAX_VERSION =~ ^[0-9]+(\.[0-9]+)+$ ]]; then
  say "JAX_VERSION '$JAX_VERSION' is not a release number like 0.12.0.1"
  exit 2
fi
[[ -n $VENV ]] || VENV=$REPO/build/venv-jax-newest
[[ $VENV == /* ]] || VENV=$REPO/$VENV # `have` runs from /

# -- the venv: reused when it has this jax and imports the project from this checkout
have() {
  [[ -x $VENV/bin/python ]] && (cd / && "$VENV/bin/python" - "$JAX_VERSION" "$REPO") <<'EOF' 2>/dev/null
import os, sys
import jax, pytest, xdist, rhhjax  # noqa: F401
ok = jax.__version__ == sys.argv[1] and os.path.dirname(os.path.dirname(rhhjax.__file__)) == sys.argv[2]
sys.exit(0 if ok else 1)
EOF
}
if ! have; then
  echo "== building $VENV (jax==$JAX_VERSION, $("$PYTHON" --version 2>&1))"
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  {
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "jax==$JAX_VERSION" pytest pytest-xdist -e "$REPO"
  } 2>&1 | { grep -v "is ignored" || true; }
  have || { say "building $VENV failed"; exit 1; }
fi

# -- the sources
SRC=$REPO
if [[ -n ${COMMIT:-} ]]; then
  SHA=$(git rev-parse --short "$COMMIT^{commit}")
  SRC=/tmp/rhhjax-$SHA
  if [[ ! -d $SRC ]]; then
    mkdir -p "$SRC.part" && git archive "$SHA" | tar -x -C "$SRC.part" && mv "$SRC.part" "$SRC"
  fi
  STATE="commit $SHA (clean export in $SRC)"
else
  STATE="working tree at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(
    git diff --quiet HEAD -- kernels rhhjax tests 2>/dev/null || echo ' + uncommitted changes')"
fi
cd "$SRC"

echo "== versions ($(date -u +%Y-%m-%dT%H:%M:%SZ); testing the $STATE)"
"$VENV/bin/python" - <<'EOF'
import sys
from importlib.metadata import version
print("python", sys.version.split()[0])
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections"):
    print(f"{name:18s}", version(name))
import jax, rhhjax
print("backend", jax.default_backend(), jax.devices())
print("rhhjax from", rhhjax.__file__)
EOF

# The ops, kernel, model, train-step and checkpoint tests (the old-checkpoint fixtures
# included): the files that exist of these patterns. Not the `pure_jax` tests (references
# against textbook maths, no kernel): CI runs those under the CPU venv's jax; here the
# references run inside the kernel tests that compare against them.
shopt -s nullglob
FILES=(tests/test_kernels_*.py tests/test_ops_*.py tests/test_models_*.py
  tests/test_train_step.py tests/test_train_checkpoint.py tests/test_old_checkpoints.py)
shopt -u nullglob
echo "== tests (jax $JAX_VERSION): ${FILES[*]}"
# -W default::DeprecationWarning shows each deprecation once in the summary instead of hiding
# the ones raised inside library code.
status=0
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "${WORKERS:-auto}" --dist loadfile \
  -W default::DeprecationWarning -m "not pure_jax" "${FILES[@]}" ${PYTEST_ARGS:-} || status=$?
echo "== newest jax ($JAX_VERSION): pytest exit $status, $((SECONDS - START)) s in all"
exit "$status"
