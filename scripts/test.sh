#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite through CTest at 1, 2, 3 and 4 ranks.
# Extra arguments go to ctest, e.g.  scripts/test.sh -L quick   (the inner loop: a few minutes),
# scripts/test.sh -L np3,  scripts/test.sh -R launcher.  HPCEVO_TEST_JOBS: ctest's -j (default 2);
# HPCEVO_JAX_CACHE: the compilation cache's directory (default ~/.cache/hpcevo/jax-test-cache).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCEVO_VENV:-$ROOT/.venv}
BIN=""
if ! command -v cmake >/dev/null 2>&1 || ! command -v ctest >/dev/null 2>&1; then
  # No system CMake (common without root): the PyPI wheel brings cmake and ctest into the venv.
  [ -x "$VENV/bin/ctest" ] || "$VENV/bin/python" -m pip install -q --disable-pip-version-check "cmake>=3.20"
  BIN="$VENV/bin/"
fi
CACHE_ARG=()
[ -n "${HPCEVO_JAX_CACHE:-}" ] && CACHE_ARG=(-DHPCEVO_JAX_CACHE="$HPCEVO_JAX_CACHE")
"${BIN}cmake" -S "$ROOT" -B "$ROOT/build" -DPython_EXECUTABLE="$VENV/bin/python" -DMPIEXEC_MAX_NUMPROCS=4 \
  "${CACHE_ARG[@]}" >/dev/null
cd "$ROOT/build"
exec "${BIN}ctest" --output-on-failure -j "${HPCEVO_TEST_JOBS:-2}" "$@"
