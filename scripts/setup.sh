#!/usr/bin/env bash
# Build hpcevo's environment in .venv/ against the system's MPI and parallel HDF5.
#
# Idempotent: a stamp records what the environment was built from; when nothing changed and
# the stack imports, this returns in about a second.
#
# Knobs (environment variables; see README "Installing on a cluster"):
#   MPICC                 MPI compiler wrapper to build mpi4py, h5py and mpi4jax with (default mpicc)
#   HDF5_DIR              prefix of a parallel HDF5 installation (h5py's own variable), or
#   HDF5_PKGCONFIG_NAME   its pkg-config name (default: the first of hdf5-mpich, hdf5-openmpi,
#                         hdf5 that pkg-config knows)
#   HPCEVO_PYTHON         interpreter for the venv (default python3; needs 3.11+)
#   HPCEVO_VENV           where the venv goes (default <repo>/.venv)
#   HPCEVO_GPU            off (default) | cuda: build mpi4jax's CUDA bridge (needs CUDA_PATH)
#   HPCEVO_NO_APT=1       never call apt-get, even as root
#   HPCEVO_REBUILD=1      rebuild the MPI-linked packages from source, bypassing pip's cache
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCEVO_VENV:-$ROOT/.venv}
PY=${HPCEVO_PYTHON:-python3}
MPICC=${MPICC:-mpicc}
GPU=${HPCEVO_GPU:-off}
STACK=$ROOT/requirements/stack.txt

say() { echo "[setup] $*" >&2; }
die() { echo "[setup] error: $*" >&2; exit 1; }

case "$GPU" in off|cuda) ;; *) die "HPCEVO_GPU='$GPU': allowed values are off, cuda" ;; esac

hdf5_choice() {
  if [ -n "${HDF5_DIR:-}" ]; then echo "dir:$HDF5_DIR"; return; fi
  if [ -n "${HDF5_PKGCONFIG_NAME:-}" ]; then echo "pc:$HDF5_PKGCONFIG_NAME"; return; fi
  command -v pkg-config >/dev/null 2>&1 || return 0
  for name in hdf5-mpich hdf5-openmpi hdf5; do
    if pkg-config --exists "$name" 2>/dev/null; then echo "pc:$name"; return; fi
  done
}

system_ready() {
  command -v "$MPICC" >/dev/null 2>&1 || return 1
  local h; h=$(hdf5_choice)
  [ -n "$h" ] || return 1
  if [ "${h%%:*}" = dir ]; then [ -d "${h#dir:}" ] || return 1; fi
  return 0
}

# 1. System MPI and parallel HDF5 -------------------------------------------------------------
if ! system_ready; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${HPCEVO_NO_APT:-}" ]; then
    say "installing MPICH and parallel HDF5 with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq mpich libmpich-dev libhdf5-mpich-dev pkg-config >/dev/null
  fi
  system_ready || die "no usable MPI + parallel HDF5. Need the MPI compiler wrapper '$MPICC' on PATH
  (set MPICC=/path/to/mpicc) and a parallel HDF5 (set HDF5_DIR=<prefix> or
  HDF5_PKGCONFIG_NAME=<name>). On a cluster: 'module load' your MPI and parallel HDF5 first."
fi
MPICC_PATH=$(command -v "$MPICC")
HDF5=$(hdf5_choice)

# 2. Fast path -----------------------------------------------------------------------------------
# The stamp covers everything that decides what gets built: the pins, this script, the project
# metadata, which MPI (its wrapper and the compile line it expands to), which HDF5, GPU or not.
fingerprint() {
  {
    cat "$STACK" "$ROOT/scripts/setup.sh" "$ROOT/pyproject.toml"
    echo "$MPICC_PATH"; "$MPICC" -show 2>/dev/null || "$MPICC" --showme 2>/dev/null || true
    echo "$HDF5 $GPU"
    "$PY" -c 'import sys; print(sys.version)' 2>/dev/null || true
  } | sha256sum | cut -d' ' -f1
}
FP=$(fingerprint)
STAMP=$VENV/.hpcevo-setup
# hpcevo is installed editable, so nothing byte-compiles its sources at install time. Do it
# here (only stale files are rewritten): otherwise every rank of every launch compiles them
# again where bytecode is not written (PYTHONDONTWRITEBYTECODE, a read-only checkout), or
# hundreds of ranks race to write the same __pycache__ on a shared file system.
precompile() {
  "$VENV/bin/python" -m compileall -q "$ROOT/hpcevo" >/dev/null \
    || say "note: could not write hpcevo's bytecode (a read-only checkout?); every launch compiles its sources"
}
if [ -z "${HPCEVO_REBUILD:-}" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FP" ] \
   && "$VENV/bin/python" -c 'import hpcevo, mpi4jax, h5py' 2>/dev/null; then
  precompile
  say "environment up to date ($VENV)"
  exit 0
fi

# 3. The venv and the stack --------------------------------------------------------------------
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PY is $("$PY" -V 2>&1); hpcevo needs Python 3.11 or newer (set HPCEVO_PYTHON)"
# Python's C headers: mpi4py, h5py and mpi4jax compile against them. Debian's python3 comes
# without them (python3.X-dev), and MPICH's packages bring the compilers but not these, so a
# fresh Debian machine has none (seen on Debian 13: scripts/debian13-check.sh).
py_headers() {
  "$PY" -c 'import os, sys, sysconfig
sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}
if ! py_headers; then
  PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${HPCEVO_NO_APT:-}" ]; then
    say "installing Python $PYV's headers (python$PYV-dev) with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "python$PYV-dev" >/dev/null || true  # the check below says what is missing
  fi
  py_headers || die "no Python.h for $PY (Python $PYV): install its headers (Debian, Ubuntu: python$PYV-dev)"
fi
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
rm -f "$STAMP"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
SRC_FLAGS=()
[ -n "${HPCEVO_REBUILD:-}" ] && SRC_FLAGS=(--no-cache-dir --force-reinstall --no-deps)

say "installing jax, numpy, build tools and the problems' libraries"
# opfunu: hpcevo reads only its CEC 2022 data files, and tests/test_cec2022.py runs one of its
# functions. Every release to date (1.0.4 the last) declares Requires-Python < 3.12, so pip finds
# no opfunu at all on 3.12+ (Debian 13's 3.13), though its code runs there (numpy, no C). There
# it goes in alone, past that declaration; on 3.11 it goes in with the rest, as it always did.
OPFUNU=(opfunu)
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then OPFUNU=(); fi
"${PIP[@]}" install -c "$STACK" jax jaxlib numpy pydantic tqdm tomli-w matplotlib filelock \
  setuptools wheel cython pkgconfig nanobind pytest pytest-timeout mypy tensorboardX cma \
  gymnax six flax "${OPFUNU[@]}" minionpy pymoo moocore coco-experiment cocopp gest-api libensemble
if [ ${#OPFUNU[@]} = 0 ]; then
  "${PIP[@]}" install -c "$STACK" --ignore-requires-python opfunu
fi

say "building mpi4py against $MPICC_PATH"
env CC="$MPICC" MPICC="$MPICC" "${PIP[@]}" install -c "$STACK" "${SRC_FLAGS[@]}" \
  --no-binary=mpi4py mpi4py

say "building h5py with MPI against HDF5 ($HDF5)"
h5env=(CC="$MPICC" HDF5_MPI=ON)
case "$HDF5" in
  dir:*) h5env+=(HDF5_DIR="${HDF5#dir:}") ;;
  pc:*) h5env+=(HDF5_PKGCONFIG_NAME="${HDF5#pc:}") ;;
esac
env "${h5env[@]}" "${PIP[@]}" install -c "$STACK" "${SRC_FLAGS[@]}" \
  --no-build-isolation --no-binary=h5py h5py

say "building mpi4jax (GPU bridge: $GPU)"
if [ "$GPU" = off ]; then
  # mpi4jax builds its CUDA bridge whenever it can find nvcc, CUDA_PATH/CUDA_ROOT/CUDA_HOME
  # or /usr/local/cuda; a stray nvcc without a toolkit makes that build fail. Hide them all.
  clean_path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do
    [ -n "$d" ] && [ ! -e "$d/nvcc" ] && echo "$d"; done | paste -sd: -)
  env -u CUDA_PATH -u CUDA_ROOT -u CUDA_HOME PATH="$clean_path" MPI4JAX_BUILD_MPICC="$MPICC_PATH" \
    "${PIP[@]}" install -c "$STACK" "${SRC_FLAGS[@]}" --no-build-isolation mpi4jax
else
  [ -n "${CUDA_PATH:-}" ] && [ -f "$CUDA_PATH/include/cuda_runtime.h" ] \
    || die "HPCEVO_GPU=cuda needs CUDA_PATH pointing at a CUDA toolkit (with include/cuda_runtime.h)"
  env MPI4JAX_BUILD_MPICC="$MPICC_PATH" "${PIP[@]}" install -c "$STACK" "${SRC_FLAGS[@]}" \
    --no-build-isolation mpi4jax
fi

say "installing hpcevo (editable)"
"${PIP[@]}" install -c "$STACK" --no-build-isolation -e "$ROOT"

# 4. Verify the pieces agree on one MPI --------------------------------------------------------
"$VENV/bin/python" - "$MPICC_PATH" <<'PY' || die "the built stack does not check out (see above); HPCEVO_REBUILD=1 rebuilds from source"
import sys
import h5py, mpi4py, mpi4jax, jax
from mpi4py import MPI
problems = []
if not h5py.get_config().mpi:
    problems.append("h5py was built without MPI")
lib = MPI.Get_library_version().splitlines()[0]
print(f"[setup] MPI: {lib}", file=sys.stderr)
print(f"[setup] jax {jax.__version__}, mpi4jax {mpi4jax.__version__}, mpi4py {mpi4py.__version__}, "
      f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}, mpi={h5py.get_config().mpi})",
      file=sys.stderr)
for p in problems:
    print(f"[setup] error: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
precompile
echo "$FP" > "$STAMP"
say "environment ready ($VENV)"
