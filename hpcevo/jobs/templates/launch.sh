# -- launch the ranks; forward the warning signal to them -----------------------------------
# The scheduler signals this shell only (--signal=B:USR1@N, scancel -b, qdel's SIGTERM); the
# launcher passes USR1 and TERM on to every rank. Told either, hpcevo writes a checkpoint at
# its next chunk boundary and exits 75: "stopped early, checkpoint written, requeue me".
forward() {
  echo "hpcevo job: SIG$1 at $(date '+%F %T'), forwarding it to the ranks" >&2
  [ -n "${launcher_pid:-}" ] && kill -s "$1" "$launcher_pid" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

echo "hpcevo job: $(date '+%F %T') on $(hostname): ${LAUNCH[*]} $PYTHON -m hpcevo ${RUN_ARGS[*]}" >&2
"${LAUNCH[@]}" "$PYTHON" -m hpcevo "${RUN_ARGS[@]}" &
launcher_pid=$!
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
echo "hpcevo job: $(date '+%F %T') ranks exited with code $rc" >&2
