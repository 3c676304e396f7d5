#!/usr/bin/env bash
# Set up (idempotent) and run the main example, CSO on 100-D Ackley, on 4 ranks.
# Extra arguments go to `hpcevo run`, e.g.  scripts/example.sh --set run.generations=200
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCEVO_VENV:-$ROOT/.venv}
cd "$ROOT"
exec "${MPIEXEC:-mpiexec}" -n "${HPCEVO_RANKS:-4}" "$VENV/bin/python" -m hpcevo run examples/cso.toml --overwrite "$@"
