#!/bin/bash
@directives@

# hpcevo batch job for PBS Pro, rendered by: @command@
# Runs @what@. PBS sends no warning before the walltime, so the run
# gets a deadline (@margin@ s before it): the ranks checkpoint and exit 75, and the job submits
# itself again, after this one, to resume; at most @max_requeues@ times.@chain_note@
@array_note@
@notes@
set -uo pipefail
JOB_START=$(date +%s)  # (before the site's set-up: its time counts against the walltime)
cd "${PBS_O_WORKDIR:-.}" || exit 1
@workdir@
PYTHON=@python@
RUN_ARGS=(@run_args@)
NRANKS=@nranks@
MAX_REQUEUES=@max_requeues@
# The resubmission needs this script's path: `hpcevo jobs submit` and `render -o` record it.
JOB_SCRIPT=${HPCEVO_JOB_SCRIPT:-@job_script@}

# -- environment ---------------------------------------------------------------------------
@environment@
@prologue@
@array_block@
# -- launcher ------------------------------------------------------------------------------
LAUNCH=(@launch@)

@deadline@
@launch_and_wait@

# -- resubmission: exit 75 means a checkpoint was written and the run wants more time ------
if [ "$rc" = 75 ]; then
  done_before=${HPCEVO_RESUBMISSIONS:-0}
  if [ -n "${HPCEVO_CHAIN:-}" ]; then
    # Submitted as a chain (`hpcevo jobs submit --resubmit chain`, or by hand: the header): the
    # next job waits on this one's failure (afternotok) and resumes; no qsub on a compute node.
    echo "hpcevo job: stopped early (75); the next job of the chain resumes from the checkpoint" >&2
  elif [ "$done_before" -ge "$MAX_REQUEUES" ]; then
    echo "hpcevo job: $MAX_REQUEUES resubmissions done; submit this script again to resume" >&2
  elif [ -z "$JOB_SCRIPT" ] || [ ! -r "$JOB_SCRIPT" ]; then
    echo "hpcevo job: script path unknown (set HPCEVO_JOB_SCRIPT); submit it again to resume" >&2
  else
    vars="HPCEVO_RESUBMISSIONS=$((done_before + 1)),HPCEVO_JOB_SCRIPT=$JOB_SCRIPT"
    after=(-W "depend=afterany:$PBS_JOBID")
@array_resubmit@    if next=$(grep -v '^#PBS -J ' "$JOB_SCRIPT" | qsub "${after[@]}" -v "$vars"); then
      echo "hpcevo job: resubmitted as $next; it resumes from the checkpoint" >&2
      exit 0
    fi
    echo "hpcevo job: qsub failed; submit this script again to resume" >&2
  fi
fi
exit "$rc"
