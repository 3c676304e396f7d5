"""Job scripts from `hpcevo jobs render slurm` on a real Slurm: a private single-node cluster
(tests/slurm_cluster.py) started for this module and torn down whatever happens.

Marked `slurm` (CTest's `slurm` test runs `pytest -m slurm`); skipped, with the reason, only
where no cluster can be had (not root, packages not installable).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

from fake_rank import fake_python, rank_log, started
import slurm_cluster
from slurm_cluster import private_slurm, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "cso.toml")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with private_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def submit(slurm, tmp: Path, *options: str) -> str:
    """`hpcevo jobs submit slurm` for the CSO example at 2 ranks."""
    return slurm.submit(tmp, EXAMPLE, "--ranks-per-node", "2", *options)


def reference_digest(tmp: Path, *overrides: str) -> str:
    return slurm_cluster.reference_digest(tmp, EXAMPLE, *overrides)


def test_rendered_job_runs_the_example_at_2_ranks(slurm, tmp_path):
    gens = ("run.generations=30", "log.every=10")
    job = submit(slurm, tmp_path, "--set", gens[0], "--set", gens[1], "--set", "run.out=run",
                 "--prologue", 'srun --mpi=pmi2 --ntasks=2 "$PYTHON" -m hpcevo info')
    info = slurm.wait(job, "COMPLETED")
    assert info["ExitCode"] == "0:0"
    log = (tmp_path / f"job-{job}.out").read_text()
    assert "ranks exited with code 0" in log
    # the binding srun made visible: local rank from SLURM_LOCALID, one thread each
    rows = [ln.split() for ln in log.splitlines() if " SLURM_LOCALID " in ln]
    assert [(r[0], r[2], r[4], r[5]) for r in rows] == [("0", "0/2", "cpu", "1"), ("1", "1/2", "cpu", "1")]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["ranks"], summary["generations"], summary["evaluations"]) == (2, 30, 1024 + 29 * 512)
    assert summary["state_digest"] == reference_digest(tmp_path, *gens)
    # What an admin sees: memory asked of this cluster's sinfo (its node has RealMemory=1024, less
    # than 4 GiB per CPU), and a deadline from the job's own start and limit (10 min, margin 60 s)
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --mem=1G\n" in script and "1G of memory per node: a whole node's" in script
    start = datetime.datetime.fromisoformat(info["StartTime"]).timestamp()
    deadline = int(re.search(r"--deadline @(\d+)", log)[1])
    assert start + 600 - 60 <= deadline <= start + 600 - 60 + 5, (info["StartTime"], deadline)


def test_signal_reaches_every_rank_and_the_job_requeues_itself(slurm, tmp_path):
    """The script's own machinery, with stand-in ranks: `scancel -b -s USR1` (the batch shell
    only, as --signal=B:USR1@N) is forwarded through srun to every rank; their exit 75 makes
    the script requeue the job, which runs again with SLURM_RESTART_COUNT=1 and completes."""
    fake = fake_python(tmp_path)
    job = submit(slurm, tmp_path, "--python", str(fake), "--prologue", f"export LOG_DIR={tmp_path}")
    slurm.signal_and_requeue(job, lambda: started(tmp_path, 2))
    info = slurm.wait(job, "COMPLETED", timeout=180)
    assert info["Restarts"] == "1"
    assert sorted(rank_log(tmp_path)) == [["0", "0"], ["0", "1"], ["0", "USR1"], ["1", "0"], ["1", "1"], ["1", "USR1"]]
    log = (tmp_path / f"job-{job}.out").read_text()
    assert "SIGUSR1" in log and "ranks exited with code 75" in log and "requeueing job" in log
    assert log.count("ranks exited with code 0") == 1


def test_signalled_run_is_requeued_resumes_and_matches_an_uninterrupted_one(slurm, tmp_path):
    # No periodic checkpoints (each costs ~0.5 s here): the signal alone makes the one resumed from.
    gens = ("run.generations=1000", "log.every=10", "checkpoint.every=0")
    job = submit(slurm, tmp_path, *[a for g in gens for a in ("--set", g)], "--set", "run.out=run")
    metrics = tmp_path / "run" / "metrics.jsonl"

    def mid_run() -> bool:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return bool(lines) and json.loads(lines[-1])["generation"] >= 20

    slurm.signal_and_requeue(job, mid_run)
    info = slurm.wait(job, "COMPLETED", timeout=600)
    assert info["Restarts"] == "1"
    log = (tmp_path / f"job-{job}.out").read_text()
    assert "stopped by SIGUSR1" in log and "ranks exited with code 75" in log
    assert "resuming from 'run/checkpoints/gen-" in log.split("ranks exited with code 75")[1]
    assert log.count("ranks exited with code 0") == 1
    assert any((tmp_path / "run" / "checkpoints").iterdir())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["ranks"], summary["generations"], summary["status"]) == (2, 1000, "complete")
    assert summary["state_digest"] == reference_digest(tmp_path, *gens)
