"""A stand-in for `python -m hpcevo run ...` in job-script tests: each rank logs how it was
started, and on its first attempt waits for USR1 and exits 75 (checkpoint written, requeue me),
as hpcevo does; started again (a requeue or resubmission) it exits 0 at once. Rank 0 also writes its exit code
to $HPCEVO_EXIT_FILE, as hpcevo's CLI does."""

from __future__ import annotations

from pathlib import Path

FAKE_RANK = """#!/bin/bash
rank=${PMI_RANK:-$SLURM_PROCID}
again=${HPCEVO_RESUBMISSIONS:-${SLURM_RESTART_COUNT:-0}}
echo "$rank $again $*" >> "$LOG_DIR/ranks.log"
if [ "$again" != 0 ]; then exit 0; fi
stopped() {
  echo "$rank USR1" >> "$LOG_DIR/ranks.log"
  # as hpcevo's CLI does: rank 0 records its exit code where the job script asked
  if [ "$rank" = 0 ] && [ -n "${HPCEVO_EXIT_FILE:-}" ]; then echo 75 > "$HPCEVO_EXIT_FILE"; fi
  exit 75
}
trap stopped USR1
touch "$LOG_DIR/started.$rank"
for _ in $(seq 600); do sleep 0.1; done
exit 1
"""


def fake_python(directory: Path) -> Path:
    """Write the stand-in interpreter; it logs to $LOG_DIR/ranks.log."""
    path = directory / "fake-python"
    path.write_text(FAKE_RANK)
    path.chmod(0o755)
    return path


def rank_log(directory: Path) -> list[list[str]]:
    """(rank, attempt) or (rank, "USR1") of each line of the log, in order."""
    return [ln.split()[:2] for ln in (directory / "ranks.log").read_text().splitlines()]


def started(directory: Path, ranks: int) -> bool:
    return all((directory / f"started.{r}").exists() for r in range(ranks))
