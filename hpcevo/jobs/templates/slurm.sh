#!/bin/bash
@directives@

# hpcevo batch job for Slurm, rendered by: @command@
# Runs @what@. At the warning signal (@margin@ s before the time
# limit) the ranks checkpoint and exit 75; the job then requeues itself and resumes, at most
# @max_requeues@ times.@relaunch_note@
@array_note@
@notes@
set -uo pipefail
JOB_START=$(date +%s)  # (before the site's set-up: its time counts against the limit)
@workdir@
PYTHON=@python@
RUN_ARGS=(@run_args@)
NRANKS=@nranks@
NNODES=@nodes@
RANKS_PER_NODE=@ranks_per_node@
MAX_REQUEUES=@max_requeues@
MIN_NODES=@min_nodes@
MAX_RELAUNCHES=@max_relaunches@

# -- environment ---------------------------------------------------------------------------
@environment@
@prologue@
@array_block@

# -- a node lost: go on with the nodes that are left ---------------------------------------
# The job keeps its allocation when a node fails (--no-kill). hpcevo's watchdog ends the ranks
# that are left within about a minute (exit code 76) and names the hosts it lost; every other
# node must answer a one-task step. The run is relaunched on the nodes that do, from its newest
# checkpoint, at their rank count (a resumed run equals one never stopped, at any rank count);
# with fewer than MIN_NODES left the job requeues instead. A failure with no node lost is the
# run's own and ends the job.
STEP=()
relaunches=0
EXCLUDED=()
relaunch() {
  case "$rc" in 0|2|75) return 1 ;; esac
  [ "$MAX_RELAUNCHES" -gt 0 ] || return 1
  local node alive=() lost=() pids=() i=0
  local nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
  for node in "${nodes[@]}"; do
    if printf '%s\n' ${EXCLUDED[@]+"${EXCLUDED[@]}"} $LOST_HOSTS | grep -qxF "$node"; then
      pids+=(skip)
    else
      timeout 30 srun --overlap --nodes=1 --ntasks=1 --cpus-per-task=1 -w "$node" true >/dev/null 2>&1 &
      pids+=($!)
    fi
  done
  for node in "${nodes[@]}"; do
    if [ "${pids[$i]}" != skip ] && wait "${pids[$i]}"; then alive+=("$node"); else lost+=("$node"); fi
    i=$((i + 1))
  done
  if [ ${#lost[@]} = 0 ]; then
    return 1
  fi
  EXCLUDED=("${lost[@]}")
  echo "hpcevo job: $(date '+%F %T') lost: ${lost[*]}; still answering: ${alive[*]:-none}" >&2
  if [ ${#alive[@]} -lt "$MIN_NODES" ]; then
    echo "hpcevo job: fewer than $MIN_NODES node(s) left (--min-nodes): requeueing instead" >&2
    rc=75
    return 1
  fi
  if [ "$relaunches" -ge "$MAX_RELAUNCHES" ]; then
    echo "hpcevo job: $MAX_RELAUNCHES relaunches done (--max-relaunches): requeueing instead" >&2
    rc=75
    return 1
  fi
  relaunches=$((relaunches + 1))
  NNODES=${#alive[@]}
  NRANKS=$((NNODES * RANKS_PER_NODE))
  # The lost node's step may still count as running: --overlap lets the new one share its CPUs.
  STEP=(--overlap --exclude="$(IFS=,; echo "${lost[*]}")")
  echo "hpcevo job: $(date '+%F %T') relaunch $relaunches of at most $MAX_RELAUNCHES: $NRANKS ranks on $NNODES node(s) (${alive[*]}), resuming from the newest checkpoint" >&2
  return 0
}

@deadline@
while :; do
  # -- launcher ----------------------------------------------------------------------------
  # srun does not pass sbatch's --cpus-per-task on to the step (Slurm 22.05+): say it again.
  LAUNCH=(@launch@)

@launch_and_wait@
  relaunch || break
done

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
