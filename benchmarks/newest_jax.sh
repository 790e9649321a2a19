#!/usr/bin/env bash
# Newest-JAX check: build (or reuse) a CPU venv for one JAX version and run the kernel,
# recurrence, low-rank and model tests under it, including their CUDA-lowering tests
# (those lower for "cuda" from a CPU host and need no GPU).
#
#   bash benchmarks/newest_jax.sh [JAX_VERSION] [PYTHON] [VENV]
#   JAX_VERSION=0.11.2 PYTHON=~/.pyenv/versions/3.12.1/bin/python bash benchmarks/newest_jax.sh
#
# Defaults: JAX_VERSION=0.12.0.1, PYTHON=~/.pyenv/versions/3.12.1/bin/python (JAX >= 0.11
# needs Python >= 3.11; 0.12 needs >= 3.12), VENV=/opt/venv-jax<major><minor> (e.g.
# /opt/venv-jax012). The venv lives outside the repository; the project is installed into it
# editable with its test extra plus the exact `jax==JAX_VERSION` pin, and pip picks the
# flax/optax/orbax releases that go with it. A venv that already has that JAX and the project
# is reused as it is (idempotent; delete the folder to rebuild). Extra pytest arguments go in
# PYTEST_ARGS (e.g. PYTEST_ARGS="-x -k lowers"). COMMIT=<ref> tests that commit instead of the
# working tree: it is exported with `git archive` to /tmp/rhhjax-<sha> and the tests run there
# (the exported packages shadow the editable install). Prints the resolved versions first,
# then pytest's summary; exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
JAX_VERSION=${1:-${JAX_VERSION:-0.12.0.1}}
PYTHON=${2:-${PYTHON:-$HOME/.pyenv/versions/3.12.1/bin/python}}
if [[ ! $JAX_VERSION =~ ^[0-9]+\.([0-9]+)(\.[0-9]+)+$ ]]; then
  echo "newest_jax.sh: JAX_VERSION '$JAX_VERSION' is not a release number like 0.12.0.1" >&2
  exit 2
fi
MINOR=${BASH_REMATCH[1]}
VENV=${3:-${VENV:-/opt/venv-jax0$(printf '%02d' "$MINOR")}}
if [[ ! -x $VENV/bin/python && ! -x $PYTHON ]]; then
  echo "newest_jax.sh: no Python at '$PYTHON' (set PYTHON or pass it as the 2nd argument)" >&2
  exit 2
fi

# Reuse the venv when it already has this JAX and imports the project from this checkout.
have() {
  [[ -x $VENV/bin/python ]] && (cd / && "$VENV/bin/python" - "$JAX_VERSION" "$REPO") <<'EOF' 2>/dev/null
import os, sys
import jax, pytest, rhhjax  # noqa: F401
ok = jax.__version__ == sys.argv[1] and os.path.dirname(os.path.dirname(rhhjax.__file__)) == sys.argv[2]
sys.exit(0 if ok else 1)
EOF
}
if ! have; then
  echo "== building $VENV (jax==$JAX_VERSION, $("$PYTHON" --version 2>&1))"
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  # pip's warnings about the machine's empty local index folders are noise here.
  "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -m pip install -q -e "$REPO[test]" "jax==$JAX_VERSION" 2>&1 |
    grep -v "is ignored" || true
  have || { echo "newest_jax.sh: building $VENV failed" >&2; exit 1; }
fi

SRC=$REPO
if [[ -n ${COMMIT:-} ]]; then
  SHA=$(git rev-parse --short "$COMMIT^{commit}")
  SRC=/tmp/rhhjax-$SHA
  if [[ ! -d $SRC ]]; then
    mkdir -p "$SRC.part" && git archive "$SHA" | tar -x -C "$SRC.part" && mv "$SRC.part" "$SRC"
  fi
  STATE="commit $SHA (clean export in $SRC)"
else
  STATE="working tree at commit $(git rev-parse --short HEAD)$(
    git diff --quiet HEAD -- kernels rhhjax tests || echo ' + uncommitted changes')"
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

# -W default::DeprecationWarning shows each deprecation once in the summary instead of hiding
# the ones raised inside library code.
echo "== tests"
# shellcheck disable=SC2086
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -W default::DeprecationWarning \
  tests/test_kernels_config.py tests/test_kernels_padded.py tests/test_kernels_stacked.py tests/test_recurrence.py tests/test_lowrank.py \
  tests/test_models.py ${PYTEST_ARGS:-}
