#!/usr/bin/env bash
# Issue 42's second device call: the speed rows at pop 262,144 with every loop shape, then the
# pop-16,384 rows again with XLA's command buffers (CUDA graphs) for loops, now that hpcevo's loops
# have fixed trip counts. bash docs/gpu-results/loops-lease-2.sh OUT_DIR [BUDGET]
set -uo pipefail
OUT=${1:?usage: loops-lease-2.sh OUT_DIR [BUDGET]}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
HPCEVO_GPU_TESTS=0 HPCEVO_GPU_PARTS="env speed" HPCEVO_GPU_SPEED_CONFIGS='[["pso",262144,100],["openes",262144,100],["cso",262144,100]]' \
  scripts/gpu-check.sh "$OUT/big" "${2:-200}" > "$OUT/big.log" 2>&1
echo "big rows exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/big.log"
t1=$(date +%s)
V=$PWD/.venv-gpu/bin
HPCEVO_GPU_SPEED_CONFIGS='[["pso",16384,100],["openes",16384,100]]' timeout 140 taskset -c 0-3 "$V/python" -m benchmarks gpu \
  --out "$OUT/cb" --budget 120 --parts command_buffers > "$OUT/cb.log" 2>&1
echo "command buffers exit $? after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/cb.log"
sed -n '/## Speed/,/## allgather/p' "$OUT"/big/gpu-*.md | head -20
grep -A12 -i "command_buffers\|command buffers" "$OUT"/cb/gpu-*.md | head -30
