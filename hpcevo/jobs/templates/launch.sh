# -- launch the ranks; forward the warning signal to them -----------------------------------
@signal_note@ Told either, hpcevo writes a checkpoint
# at its next chunk boundary and exits 75: "stopped early, checkpoint written, requeue me".
forward() {
  echo "hpcevo job: SIG$1 at $(date '+%F %T'), forwarding it to the ranks" >&2
  [ -n "${launcher_pid:-}" ] && kill -s "$1" "$launcher_pid" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# MPICH's mpiexec (hydra, 4.0) sometimes exits 0 after forwarding USR1 although every rank
# exited 75: 32 launches in 40 at one rank on a loaded machine. Rank 0 therefore also writes its
# exit code to this file (in the working directory, which its node can see), and the code there
# wins over a 0 from the launcher.
HPCEVO_EXIT_FILE=$(mktemp "$PWD/.hpcevo-exit.XXXXXX" 2>/dev/null) || HPCEVO_EXIT_FILE=
export HPCEVO_EXIT_FILE

echo "hpcevo job: $(date '+%F %T') on $(hostname): ${LAUNCH[*]} $PYTHON -m hpcevo ${RUN_ARGS[*]}" >&2
"${LAUNCH[@]}" "$PYTHON" -m hpcevo "${RUN_ARGS[@]}" &
launcher_pid=$!
# When a node is lost, hpcevo's watchdog ends the ranks that are left (exit code 76, written to
# the exit file); a launcher that cannot reach the lost node may still wait for it until the
# scheduler declares it down, minutes later. It gets 10 s, then it is ended.
reaper_pid=
if [ -n "$HPCEVO_EXIT_FILE" ]; then
  (
    while kill -0 "$launcher_pid" 2>/dev/null; do
      if [ "$(cat "$HPCEVO_EXIT_FILE" 2>/dev/null)" = 76 ]; then
        sleep 10
        kill -0 "$launcher_pid" 2>/dev/null || exit 0
        echo "hpcevo job: $(date '+%F %T') the launcher still waits 10 s after the watchdog ended the ranks: ending it" >&2
        kill -TERM "$launcher_pid" 2>/dev/null
        sleep 5
        kill -KILL "$launcher_pid" 2>/dev/null
        exit 0
      fi
      sleep 1
    done
  ) &
  reaper_pid=$!
fi
while :; do
  wait "$launcher_pid"
  rc=$?
  if [ "$rc" -gt 128 ]; then
    # A trapped signal cuts `wait` short while the ranks are still writing their checkpoint.
    kill -0 "$launcher_pid" 2>/dev/null && continue
    wait "$launcher_pid" 2>/dev/null
    again=$?
    [ "$again" = 127 ] || rc=$again
  fi
  break
done
trap - USR1 TERM
[ -n "$reaper_pid" ] && kill "$reaper_pid" 2>/dev/null
LOST_HOSTS=
if [ -n "$HPCEVO_EXIT_FILE" ]; then
  recorded=$(cat "$HPCEVO_EXIT_FILE" 2>/dev/null)
  LOST_HOSTS=$(cat "$HPCEVO_EXIT_FILE.lost" 2>/dev/null)
  rm -f "$HPCEVO_EXIT_FILE" "$HPCEVO_EXIT_FILE.lost"
  case "$recorded" in
    ''|*[!0-9]*|0) ;;
    76) rc=76 ;;  # the watchdog's, whatever the launcher says after being ended
    *) if [ "$rc" = 0 ]; then
         echo "hpcevo job: the launcher exited 0, but rank 0 exited $recorded: taking $recorded" >&2
         rc=$recorded
       fi ;;
  esac
fi
echo "hpcevo job: $(date '+%F %T') ranks exited with code $rc" >&2
