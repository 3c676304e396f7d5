"""Studies as a user runs them from the shell: plan, run under mpiexec, a SIGTERM, a resume at
another rank count, status, report, job scripts. Marked ``launcher``: each test starts its own
mpiexec jobs (run with a plain ``python -m pytest -m launcher``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_launcher import MPIEXEC, ROOT, clean_env, hpcevo

pytestmark = pytest.mark.launcher

STUDY = """
[study]
name = "{name}"
out = "{out}"
seeds = {seeds}

[base]
run.generations = {generations}
algorithm.pop_size = 16
problem.dim = 4
log.every = 25
checkpoint.every = 25

[[axis]]
key = "algorithm.name"
values = ["cso", "de"]

[[axis]]
key = "problem.name"
values = ["sphere", "rastrigin"]
"""


def write_study(path: Path, out: Path, generations: int = 300, seeds: int = 2) -> Path:
    path.write_text(STUDY.format(name=path.stem, out=out, generations=generations, seeds=seeds))
    return path


def digests(out: Path) -> dict[str, str]:
    return {p.name: json.loads((p / "summary.json").read_text())["state_digest"]
            for p in sorted((out / "runs").iterdir()) if not p.name.startswith(".")}


def ends(out: Path) -> list[dict]:
    path = out / "journal.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [e for e in lines if e["event"] == "end"]


def most_in_flight(out: Path) -> int:
    """The most runs one group had begun and not yet ended at once (the journal)."""
    lines = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines() if x.strip()]
    group_of: dict[str, tuple[int, int]] = {}
    now: dict[tuple[int, int], int] = {}
    most, launch = 0, 0
    for e in lines:
        if e["event"] == "study":
            launch += 1
        elif e["event"] == "start":
            group_of[e["run"]] = g = (launch, e["group"])
            now[g] = now.get(g, 0) + 1
            most = max(most, now[g])
        elif e["event"] == "end" and e["run"] in group_of:
            now[group_of[e["run"]]] -= 1
    return most


def test_a_study_stopped_by_sigterm_resumes_at_another_rank_count_to_the_same_digests(tmp_path):
    whole = write_study(tmp_path / "whole.toml", tmp_path / "whole")
    r = hpcevo(None, "study", str(whole), "-q", timeout=600)  # one rank, no launcher, never stopped
    assert r.returncode == 0, r.stderr
    want = digests(tmp_path / "whole")
    assert len(want) == 8

    cut = write_study(tmp_path / "cut.toml", tmp_path / "cut")
    # MPICH's mpiexec may exit 0 after forwarding a signal although the ranks exited 75; rank 0
    # also writes its code where HPCEVO_EXIT_FILE says (what the job scripts read, jobs/templates)
    exit_file = tmp_path / "exit-code"
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "hpcevo", "study", str(cut)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**clean_env(), "HPCEVO_EXIT_FILE": str(exit_file)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(ends(tmp_path / "cut")) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the study did not finish 3 runs in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # the launcher forwards it to both ranks
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert exit_file.read_text().strip() == "75" and proc.returncode in (75, 0), err
    assert "continue with --resume" in out and "Traceback" not in err
    done_before = {e["run"] for e in ends(tmp_path / "cut") if e["status"] == "complete"}
    assert 3 <= len(done_before) < 8
    assert any(e["status"] == "stopped" for e in ends(tmp_path / "cut"))

    status = hpcevo(None, "study", "status", str(cut))
    assert status.returncode == 1 and "pending" in status.stdout and "--resume" in status.stdout

    before = len(ends(tmp_path / "cut"))
    r = hpcevo(3, "study", str(cut), "--resume", timeout=600)
    assert r.returncode == 0, r.stderr
    assert digests(tmp_path / "cut") == want
    assert most_in_flight(tmp_path / "cut") >= 2  # (runs of one program were batched, by default)
    resumed = {e["run"] for e in ends(tmp_path / "cut")[before:]}
    assert len(resumed) == 8 - len(done_before) and not done_before & resumed  # done runs were not run again
    assert "done skipped" in r.stdout and "3 ranks" in r.stdout

    status = hpcevo(None, "study", "status", str(cut))
    assert status.returncode == 0 and "8 done" in status.stdout
    rep = hpcevo(None, "study", "report", str(cut))
    assert rep.returncode == 0, rep.stderr
    for name in ("table.md", "table.csv", "stats.json", "convergence.png", "ecdf.png", "final.png"):
        assert (tmp_path / "cut" / "report" / name).stat().st_size > 0
    assert "| cso | 2 |" in rep.stdout and "Friedman" not in rep.stdout  # two configurations: no Friedman


def test_study_commands_speak_once_and_exit_2_on_bad_input(tmp_path):
    study = write_study(tmp_path / "s.toml", tmp_path / "s", generations=5, seeds=3)
    r = hpcevo(None, "study", "plan", str(study))
    assert r.returncode == 0 and "12 runs = 2 configuration(s) x 2 problem(s) x 3 seed(s)" in r.stdout
    assert "de__rastrigin__s2" in r.stdout
    plan = [json.loads(x) for x in hpcevo(None, "study", "plan", str(study), "--json").stdout.splitlines()]
    assert [p["name"] for p in plan][:2] == ["cso__sphere__s0", "cso__sphere__s1"]
    assert hpcevo(None, "study", "status", str(study)).returncode == 1  # nothing done yet

    bad = tmp_path / "bad.toml"
    bad.write_text(study.read_text().replace('values = ["cso", "de"]', 'values = ["cso", "dee"]'))
    r = hpcevo(2, "study", str(bad), timeout=120)
    assert r.returncode == 2 and r.stderr.count("hpcevo: error:") == 1, r.stderr
    assert "run 'dee__sphere__s0'" in r.stderr and "did you mean 'de'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s" / "journal.jsonl").exists()

    r = hpcevo(2, "study", str(study), "-q", timeout=300)
    assert r.returncode == 0, r.stderr
    r = hpcevo(2, "study", str(study), timeout=120)
    assert r.returncode == 2 and "already holds this study" in r.stderr and "--resume" in r.stderr
    r = hpcevo(None, "study", "run", str(study), "--slice", "3/3")
    assert r.returncode == 2 and "--slice '3/3'" in r.stderr


def test_job_scripts_run_a_study_or_its_slices(tmp_path):
    study = write_study(tmp_path / "s.toml", tmp_path / "s")
    r = hpcevo(None, "jobs", "render", "slurm", str(study), "--study", "--time", "1h", "--nodes", "2",
               "--array", "4")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --array=0-3" in r.stdout and "RUN_ARGS=(study run" in r.stdout and "--resume" in r.stdout
    assert 'RUN_ARGS+=(--slice "$SLURM_ARRAY_TASK_ID"/4)' in r.stdout
    r = hpcevo(None, "jobs", "render", "pbs", str(study), "--study", "--time", "1h")
    assert r.returncode == 0 and "-J" not in r.stdout.split("set -uo")[0] and "study run" in r.stdout
    for args, message in ((("--seeds", "0-3"), "a study sets its seeds itself"),
                          (("--set", "run.seed=1"), "change the study file"),
                          (("--array", "99"), "fewer than array tasks")):
        r = hpcevo(None, "jobs", "render", "slurm", str(study), "--study", "--time", "1h", *args)
        assert r.returncode == 2 and message in r.stderr, r.stderr
    r = hpcevo(None, "jobs", "render", "slurm", str(ROOT / "examples" / "cso.toml"), "--time", "1h", "--array", "2")
    assert r.returncode == 2 and "add --study" in r.stderr
