#!/usr/bin/env bash
# Issue 41's device check (docs/gpu.md, 2026-11-27 lease): the GPU kit's bring-up and digests, then
# many small runs on one GPU: hpcevo.Batch against one run at a time and evosax's vmap
# (benchmarks/batch.py), and the BBOB campaign slice of issue 41's table (24 functions x
# instances 1-3, dim 5, BIPOP-CMA-ES) as `hpcevo study` at 1 rank, cold and over its cache.
# Run from the repository root on the GPU machine: bash docs/gpu-results/campaign-lease.sh OUT_DIR
set -uo pipefail
OUT=${1:?usage: campaign-lease.sh OUT_DIR}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
HPCEVO_GPU_TESTS=0 HPCEVO_GPU_PARTS="env digests" scripts/gpu-check.sh "$OUT" 100 > "$OUT/check.log" 2>&1
echo "gpu-check exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/check.log"
V=$PWD/.venv-gpu/bin
export PATH=$V:$PATH
t1=$(date +%s)
timeout 125 taskset -c 0-3 "$V/python" -m benchmarks.batch --device gpu --runs 64 --generations 50 --repeats 3 \
  --only cmaes,pso,openes --out "$OUT/batch-gpu.json" > "$OUT/batch-gpu.log" 2>&1
echo "batch exit $? after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/batch-gpu.log"
t2=$(date +%s)
"$V/python" benchmarks/campaign.py --sides hpcevo --ranks 1 --instances 1 2 3 --timeout "${CAMPAIGN_TIMEOUT:-150}" \
  --mpiexec "$V/mpiexec" --out "$OUT/campaign-gpu.json" > "$OUT/campaign-gpu.log" 2>&1
echo "campaign exit $? after $(( $(date +%s) - t2 )) s" | tee -a "$OUT/campaign-gpu.log"
tail -12 "$OUT/batch-gpu.log"; tail -6 "$OUT/campaign-gpu.log"; grep -i "digest\|all_equal" "$OUT"/gpu-*.md 2>/dev/null | head -12
