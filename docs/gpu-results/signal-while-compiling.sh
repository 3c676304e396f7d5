#!/usr/bin/env bash
# The device check of 2026-11-27 (docs/gpu.md): a SIGTERM while the programs compile on the GPU.
# Run from the repository root on the GPU machine: bash docs/gpu-results/signal-while-compiling.sh OUT_DIR
set -u
OUT=$1; mkdir -p $OUT
scripts/gpu-node-setup.sh .whl/gpu > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
V=$PWD/.venv-gpu/bin
export PYTHONUNBUFFERED=1
try() {  # name ranks delay
  local name=$1 n=$2 delay=$3 log=$OUT/$1.log
  local cmd=($V/python -m hpcevo run examples/cso.toml --set run.name=$name --set "run.out=\"$OUT/$name\"" --set algorithm.pop_size=262144 --set run.generations=3000 --set parallel.share_gpus=true --set "parallel.compile_cache=\"$OUT/cache-$name\"")
  [ "$n" -gt 1 ] && cmd=($V/mpiexec -n $n "${cmd[@]}")
  HPCEVO_EXIT_FILE=$OUT/$name.exit "${cmd[@]}" > $log 2>&1 &
  local pid=$!
  until grep -q "^hpcevo " $log 2>/dev/null; do sleep 0.05; kill -0 $pid 2>/dev/null || break; done
  sleep $delay
  local t0=$(date +%s.%N); kill -TERM $pid; wait $pid; local rc=$?; local t1=$(date +%s.%N)
  echo "== $name: $n rank(s), SIGTERM ${delay}s after the banner: rc=$rc exit-file=$(cat $OUT/$name.exit 2>/dev/null) ended $(python3 -c "print(round($t1-$t0,2))") s after the signal"
  grep -v "^ *$" $log | tail -4
  ls $OUT/$name/checkpoints 2>/dev/null | head -3
}
try one 1 1.0
try two 2 1.0
# the same run left alone: how long its compilation takes on this GPU
$V/python -m hpcevo run examples/cso.toml --set run.name=whole --set "run.out=\"$OUT/whole\"" --set algorithm.pop_size=262144 --set run.generations=20 --set "parallel.compile_cache=\"$OUT/cache-whole\"" -q
python3 -c "import json; s=json.load(open('$OUT/whole/summary.json')); print('== alone: compile_s', round(s['compile_s'],2), 'wall_s', round(s['wall_s'],2))"
