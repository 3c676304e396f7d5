#!/usr/bin/env bash
# The 2026-11-28 device check (docs/gpu.md, "Issue 41's second lease"): what changed on a GPU since
# the last lease. The kit's bring-up and digests; many small runs as lanes of one program
# (jax.vmap over Loop.functions(), at K = 1 and K = 1,024, beside evosax's vmap); one BBOB
# program for all 24 functions (a lax.switch: its index read on the host?) against a built-in
# Rosenbrock, ms per generation; the dim-5 BBOB campaign slice as a study, batched and one run at a
# time; then, with the time left, the whole examples/bbob.toml from an empty cache (runs done).
# Run from the repository root on the GPU machine: bash docs/gpu-results/lanes-lease.sh OUT_DIR [BUDGET]
set -uo pipefail
OUT=${1:?usage: lanes-lease.sh OUT_DIR [BUDGET]}; mkdir -p "$OUT"
BUDGET=${2:-480}
W=${LEASE_WORK:-/tmp/lease-work}; rm -rf "$W"; mkdir -p "$W"  # run folders stay on the node
export PYTHONUNBUFFERED=1
t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
HPCEVO_GPU_TESTS=0 HPCEVO_GPU_PARTS="env digests" scripts/gpu-check.sh "$OUT" 100 > "$OUT/check.log" 2>&1
echo "gpu-check exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/check.log"
V=$PWD/.venv-gpu/bin
export PATH=$V:$PATH
for k in 1 1024; do
  t=$(date +%s)
  timeout 90 taskset -c 0-3 "$V/python" -m benchmarks.batch --device gpu --sides vmap evosax --runs $k \
    --generations 100 --repeats $(( k > 1 ? 2 : 3 )) --only cmaes,pso,openes --out "$OUT/lanes-k$k.json" > "$OUT/lanes-k$k.log" 2>&1
  echo "lanes K=$k exit $? after $(( $(date +%s) - t )) s" | tee -a "$OUT/lanes-k$k.log"
done
# One BBOB program (24 functions, a switch) against a built-in function, CMA-ES, dim 10, 1,000 generations.
t=$(date +%s)
mkdir -p "$W/switch" && (cd "$W/switch" && for pop in 16 1024; do for p in bbob rosenbrock; do
  extra=""; [ $p = bbob ] && extra=$'function = 8\ninstance = 1'
  printf '[run]\nname = "%s-%s"\ngenerations = 1000\ndtype = "float64"\n[algorithm]\nname = "cmaes"\npop_size = %s\n[problem]\nname = "%s"\ndim = 10\n%s\n' \
    $p $pop $pop $p "$extra" > $p-$pop.toml
  timeout 40 "$V/python" -m hpcevo run $p-$pop.toml --quiet > $p-$pop.log 2>&1
  "$V/python" -c "import json,sys; s=json.load(open('runs/$p-$pop/summary.json')); print('switch-row', '$p', $pop, s['generations'], round(s['wall_s'] / s['generations'] * 1e3, 4), 'ms/gen, compile', round(s['compile_s'], 2))" 2>&1 | tee -a "$OUT/switch.log"
done; done)
echo "switch rows after $(( $(date +%s) - t )) s" | tee -a "$OUT/switch.log"
t=$(date +%s)
"$V/python" benchmarks/campaign.py --sides hpcevo --ways store --ranks 1 --instances 1 2 3 --batch 1 \
  --timeout 75 --mpiexec "$V/mpiexec" --out "$OUT/campaign-gpu.json" > "$OUT/campaign-gpu.log" 2>&1
echo "campaign exit $? after $(( $(date +%s) - t )) s" | tee -a "$OUT/campaign-gpu.log"
rest=$(( $(left) - 25 ))
if [ "$rest" -gt 40 ]; then
  t=$(date +%s)
  mkdir -p "$W/whole" "$W/whole-cache" && cp examples/bbob.toml "$W/whole/"
  (cd "$W/whole" && JAX_COMPILATION_CACHE_DIR="$W/whole-cache" timeout -s TERM "$rest" "$V/mpiexec" -n 1 \
    "$V/python" -m hpcevo study bbob.toml --quiet > "$OUT/whole-study.log" 2>&1; echo "exit $?" >> "$OUT/whole-study.log")
  echo "whole examples/bbob.toml, first launch, stopped at $rest s: $(grep -rl --include=summary.json '"status": "complete"' "$W/whole" | wc -l) of 2160 runs done after $(( $(date +%s) - t )) s" | tee "$OUT/bbob-whole-gpu.log"
fi
grep -h "digest\|all_equal" "$OUT"/gpu-*.md 2>/dev/null | head -12
tail -8 "$OUT/lanes-k1.log" "$OUT/lanes-k1024.log"; cat "$OUT/switch.log"; tail -6 "$OUT/campaign-gpu.log"
tail -6 "$OUT/bbob-whole-gpu.log" 2>/dev/null
echo "lease script done after $(( $(date +%s) - t0 )) s"
