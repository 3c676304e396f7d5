#!/usr/bin/env bash
# Issue 42's device check (docs/gpu.md, "Issue 42's lease"): loops of fixed trip counts on a GPU.
# The kit's bring-up, the digests (1 rank, again, 2 ranks sharing, 2 -> 1 resume, dispatches of
# another length, and the loops of data trip counts as the baseline), the speed rows with every loop
# shape side by side, then docs/gpu-results/loops-check.py at 1 and 2 ranks on the GPU.
# Run from the repository root on the GPU machine: bash docs/gpu-results/loops-lease.sh OUT_DIR [BUDGET]
set -uo pipefail
OUT=${1:?usage: loops-lease.sh OUT_DIR [BUDGET]}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
HPCEVO_GPU_TESTS=0 HPCEVO_GPU_PARTS="env digests speed" scripts/gpu-check.sh "$OUT" "${2:-300}" > "$OUT/check.log" 2>&1
echo "gpu-check exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/check.log"
V=$PWD/.venv-gpu/bin
t1=$(date +%s)
for n in 1 2; do
  timeout 150 "$V/mpiexec" -n $n "$V/python" docs/gpu-results/loops-check.py > "$OUT/loops-check-$n.log" 2>&1
  echo "loops-check $n rank(s) exit $? after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/loops-check-$n.log"
done
grep -h '"check"' "$OUT"/loops-check-*.log
sed -n '/## Digests/,/## allgather/p' "$OUT"/gpu-*.md 2>/dev/null | head -60
