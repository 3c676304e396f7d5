#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite through CTest at 1, 2, 3 and 4 ranks.
# Extra arguments go to ctest, e.g.  scripts/test.sh -L quick   (the inner loop: a few minutes),
# scripts/test.sh -L np3,  scripts/test.sh -R launcher.  HPCEVO_TEST_JOBS: ctest's -j (default 3,
# the slots CMakeLists.txt lays the suite out for: see its head);
# HPCEVO_JAX_CACHE: the compilation cache's directory (default ~/.cache/hpcevo/jax-test-cache).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCEVO_VENV:-$ROOT/.venv}
# What the gpu_kit tier would otherwise fetch from the package registry, fetched once with the
# set-up (a cache keyed by what it is made of): the tier itself then runs offline.
HPCEVO_VENV=$VENV bash "$ROOT/scripts/gpu-kit-cache.sh" >/dev/null
BIN=""
if ! command -v cmake >/dev/null 2>&1 || ! command -v ctest >/dev/null 2>&1; then
  # No system CMake (common without root): the PyPI wheel brings cmake and ctest into the venv.
  [ -x "$VENV/bin/ctest" ] || "$VENV/bin/python" -m pip install -q --disable-pip-version-check "cmake>=3.20"
  BIN="$VENV/bin/"
fi
CACHE_ARG=()
[ -n "${HPCEVO_JAX_CACHE:-}" ] && CACHE_ARG=(-DHPCEVO_JAX_CACHE="$HPCEVO_JAX_CACHE")
JOBS=${HPCEVO_TEST_JOBS:-3}
"${BIN}cmake" -S "$ROOT" -B "$ROOT/build" -DPython_EXECUTABLE="$VENV/bin/python" -DMPIEXEC_MAX_NUMPROCS=4 \
  -DHPCEVO_TEST_SLOTS="$JOBS" "${CACHE_ARG[@]}" >/dev/null
cd "$ROOT/build"
exec "${BIN}ctest" --output-on-failure -j "$JOBS" "$@"
