#!/usr/bin/env bash
# Set up (idempotent) and run the main example, CSO on 100-D Ackley, on up to 4 ranks (no more than the cores).
# Extra arguments go to `hpcevo run`, e.g.  scripts/example.sh --set run.generations=200
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCEVO_VENV:-$ROOT/.venv}
cd "$ROOT"
CORES=$(nproc 2>/dev/null || echo 4)
RANKS=${HPCEVO_RANKS:-$(( CORES < 4 ? CORES : 4 ))}  # more ranks than cores only slows a run down
exec "${MPIEXEC:-mpiexec}" -n "$RANKS" "$VENV/bin/python" -m hpcevo run examples/cso.toml --overwrite "$@"
