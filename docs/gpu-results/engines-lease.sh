#!/usr/bin/env bash
# Issue 43's device check (docs/gpu.md): hpcevo on a communicator it is given binds its GPU by the
# ranks' order within that communicator, and hpcevo.minimize runs on the GPU.
# Run from the repository root on the GPU machine: bash docs/gpu-results/engines-lease.sh OUT_DIR
set -u
OUT=$1; mkdir -p "$OUT"
t0=$(date +%s)
scripts/gpu-node-setup.sh .whl/gpu > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
echo "set-up $(( $(date +%s) - t0 )) s"
V=$PWD/.venv-gpu/bin
export PYTHONUNBUFFERED=1
"$V/python" -m hpcevo run examples/cso.toml --set run.generations=50 --set "run.out=\"$OUT/alone\"" -q --overwrite
echo "alone, 1 rank: $("$V/python" -c "import json; s=json.load(open('$OUT/alone/summary.json')); print(s['state_digest'][:16], s.get('device'))")"
# 2 ranks: world rank 0 serves, world rank 1 (launcher local rank 1) runs hpcevo alone on the
# communicator it is given, where it is local rank 0: the one GPU, cuda:0
(cd "$OUT" && timeout 120 "$V/mpiexec" -n 2 "$V/python" "$OLDPWD/examples/part_of_a_job.py") 2>&1 | tail -3
"$V/python" -c "import json; s=json.load(open('$OUT/runs/part-of-a-job/summary.json')); print('given comm:', s['state_digest'][:16], s.get('device'), s.get('ranks'))"
(cd "$OUT" && timeout 150 "$V/python" "$OLDPWD/examples/minimize.py") 2>&1 | tail -3
echo "total $(( $(date +%s) - t0 )) s"
