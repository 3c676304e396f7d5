#!/bin/bash
@directives@

# hpcevo batch job for Slurm, rendered by: @command@
# Runs @what@. At the warning signal (@margin@ s before the time
# limit) the ranks checkpoint and exit 75; the job then requeues itself and resumes, at most
# @max_requeues@ times.
@array_note@
set -uo pipefail
@workdir@
PYTHON=@python@
RUN_ARGS=(@run_args@)
NRANKS=@nranks@
MAX_REQUEUES=@max_requeues@

# -- environment ---------------------------------------------------------------------------
@environment@
@prologue@
# -- array job: the task's index picks its share --------------------------------------------
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
  RUN_ARGS+=(@array_args@)
fi

# -- launcher ------------------------------------------------------------------------------
# srun does not pass sbatch's --cpus-per-task on to the step (Slurm 22.05+): say it again.
LAUNCH=(@launch@)

@launch_and_wait@

# -- requeue: exit 75 means a checkpoint was written and the run wants more time -----------
if [ "$rc" = 75 ]; then
  restarts=${SLURM_RESTART_COUNT:-0}
  if [ "$restarts" -lt "$MAX_REQUEUES" ]; then
    echo "hpcevo job: requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of at most $MAX_REQUEUES); it resumes from the checkpoint" >&2
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "hpcevo job: scontrol requeue failed; submit this script again to resume" >&2
  else
    echo "hpcevo job: $MAX_REQUEUES requeues done; submit this script again to resume" >&2
  fi
fi
exit "$rc"
