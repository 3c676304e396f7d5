#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one call: set up offline, then the GPU checks and
# measurements (python -m benchmarks gpu) on cores 0-3, while the MPI test tiers at 1 and 2 ranks
# and the pure tests run under the node's JAX on the other cores (on the CPU: the GPU is kept
# for the measurements).
#
#   scripts/gpu-check.sh OUT_DIR [BUDGET_SECONDS]
#
# The wheelhouse: .whl/gpu (scripts/gpu-wheelhouse.sh), or HPCEVO_WHEELHOUSE; the image's
# interpreter: python3, or HPCEVO_PYTHON (both passed on to scripts/gpu-node-setup.sh).
#
# Writes to OUT_DIR: setup.log, gpu-*.json/.md/.log, tests-pure.log, tests-np1.log, tests-np2.log.
# HPCEVO_GPU_PARTS: the parts of python -m benchmarks gpu to run (default all); HPCEVO_GPU_TESTS=0:
# no test tiers.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: scripts/gpu-check.sh OUT_DIR [BUDGET_SECONDS]}
BUDGET=${2:-400}
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONUNBUFFERED=1
# Where the image's own MPI is Open MPI (gpu-node-setup.sh's fallback): as root, oversubscribed,
# in a VM without cross-memory attach. MPICH ignores these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
{
  echo "== machine"; nvidia-smi -L 2>&1; nproc; command -v gcc g++ nvcc python3
  "${HPCEVO_PYTHON:-python3}" -c 'import sys, jax; print(sys.executable, sys.version.split()[0], "jax", jax.__version__)' 2>&1
  echo "== the image's MPI, if any"; command -v mpicc mpirun mpiexec; mpicc -show 2>&1 | head -2; mpirun --version 2>&1 | head -1
  "${HPCEVO_PYTHON:-python3}" -c 'import mpi4py, h5py; print("image mpi4py", mpi4py.__version__, mpi4py.__file__, "h5py", h5py.__version__, "mpi", h5py.get_config().mpi)' 2>&1
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; echo "LD_PRELOAD=${LD_PRELOAD:-}"
  echo "== set-up"
} > "$OUT/setup.log" 2>&1
start=$(date +%s)
scripts/gpu-node-setup.sh "${HPCEVO_WHEELHOUSE:-.whl/gpu}" >> "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }
echo "set-up took $(( $(date +%s) - start )) s" >> "$OUT/setup.log"
V=$ROOT/.venv-gpu/bin

# The test tiers on the CPU cores 4..: the GPU hidden, as CPU ranks.
cores=$(nproc)
tests() {  # name, cpu list, command...
  local name=$1 cpus=$2; shift 2
  ( export CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu PATH=$V:$PATH  # the venv's mpiexec, as the tests expect
    timeout $(( BUDGET + 30 )) taskset -c "$cpus" "$@" -q -p no:cacheprovider --continue-on-collection-errors \
      > "$OUT/tests-$name.log" 2>&1; echo "exit $?" >> "$OUT/tests-$name.log" ) &
}
if [ "$cores" -ge 8 ] && [ "${HPCEVO_GPU_TESTS:-1}" != 0 ]; then
  last=$(( cores - 1 ))
  tests pure "4-$(( 4 + (last - 4) / 2 ))" "$V/python" -m pytest -m "single_process and not launcher and not slow" tests
  tests np1 "$(( 5 + (last - 4) / 2 ))-$(( 5 + (last - 4) / 2 ))" "$V/python" -m pytest -m "not single_process and not launcher and not slow" tests
  tests np2 "$(( 6 + (last - 4) / 2 ))-$last" "$V/mpiexec" -n 2 "$V/python" -m mpi4py -m pytest -m "not single_process and not launcher and not slow" tests
fi
gpu_cpus=0-3; [ "$cores" -lt 8 ] && gpu_cpus=0-$(( cores - 1 ))
parts=()
[ -n "${HPCEVO_GPU_PARTS:-}" ] && parts=(--parts $HPCEVO_GPU_PARTS)
taskset -c "$gpu_cpus" "$V/python" -m benchmarks gpu --out "$OUT" --budget "$BUDGET" "${parts[@]}"
rc=$?
wait
for f in "$OUT"/tests-*.log; do [ -e "$f" ] && { echo "== $f"; tail -4 "$f"; }; done
exit $rc
