#!/usr/bin/env bash
# Re-render the example job scripts in jobs/ (the README's HPC section shows them;
# tests/test_jobs.py fails when they differ from what `hpcevo jobs render` writes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${HPCEVO_VENV:-.venv}/bin/python
render() { "$PY" -m hpcevo jobs render "$@"; }

# 2 GPU nodes, 4 GPUs each: one rank per GPU, 8 ranks.
render slurm examples/cso.toml --nodes 2 --gpus-per-node 4 --cpus-per-node 64 --srun-mpi pmi2 --time 12:00:00 \
  --account myproject --partition gpu --python .venv/bin/python -o jobs/slurm-gpu-2nodes.sbatch
# 2 CPU nodes of 128 cores: 8 ranks per node, one per 16-core group, 16 threads each.
render slurm examples/cso.toml --nodes 2 --ranks-per-node 8 --cpus-per-rank 16 --srun-mpi pmi2 \
  --set parallel.threads_per_rank=16 --time 1-00:00:00 --account myproject --partition cpu \
  --python .venv/bin/python -o jobs/slurm-cpu-2nodes.sbatch
# The same on PBS Pro.
render pbs examples/cso.toml --nodes 2 --gpus-per-node 4 --cpus-per-node 64 --time 12:00:00 --account myproject \
  --queue gpu --python .venv/bin/python -o jobs/pbs-gpu-2nodes.pbs
# A seed sweep on PBS: 10 array subjobs, subjob i runs seed i on 2 CPU nodes.
render pbs examples/cso.toml --nodes 2 --ranks-per-node 8 --cpus-per-rank 16 \
  --set parallel.threads_per_rank=16 --time 1-00:00:00 --queue workq --seeds 0-9 \
  --python .venv/bin/python -o jobs/pbs-cpu-2nodes-seeds.pbs
# A study bigger than one allocation on Slurm: 4 array tasks, task i runs slice i of the 120 runs.
render slurm examples/study.toml --study --array 4 --nodes 1 --ranks-per-node 16 --srun-mpi pmi2 --time 02:00:00 \
  --account myproject --partition cpu --python .venv/bin/python -o jobs/slurm-study-array.sbatch
