"""Job scripts: `hpcevo jobs render` checks requests, writes directives a scheduler accepts, and
its scripts run: PBS ones under bash in a simulated PBS environment with the local mpiexec.

The real-Slurm test is tests/test_slurm.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpcevo.errors import UsageError
from fake_rank import fake_python, rank_log, started
from hpcevo.jobs import JobRequest, parse_time, plan, render

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "cso.toml")


@pytest.fixture(autouse=True)
def no_scheduler_here(tmp_path_factory, monkeypatch):
    """sinfo and pbsnodes that answer nothing, as on a machine without a scheduler: what a GPU
    job's CPUs default to must not depend on this machine (a test puts its own on PATH)."""
    fakebin = tmp_path_factory.mktemp("no-scheduler")
    for name in ("sinfo", "pbsnodes"):
        (fakebin / name).write_text("#!/bin/sh\necho 'no scheduler here' >&2\nexit 1\n")
        (fakebin / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}:{os.environ['PATH']}")


def req(scheduler="slurm", **kw) -> JobRequest:
    kw.setdefault("time", "01:00:00")
    return JobRequest(scheduler=scheduler, config=kw.pop("config", EXAMPLE), **kw)


# -- linting: directives parsed as the scheduler parses them -----------------------------------
SBATCH_KEYS = {"job-name", "nodes", "ntasks-per-node", "cpus-per-task", "mem", "gpus-per-node", "time", "signal", "no-kill",
               "requeue", "open-mode", "output", "account", "partition", "qos", "array"}
PBS_OPTIONS = {"-N", "-l", "-r", "-j", "-o", "-q", "-A", "-J"}


def directives(text: str, prefix: str) -> list[str]:
    """The directive lines, checked to be where the scheduler reads them: right after #!,
    before any command (sbatch and qsub stop at the first line that is not one)."""
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    out = []
    for line in lines[1:]:
        if not line.startswith(prefix + " "):
            break
        out.append(line[len(prefix) + 1:])
    rest = [ln for ln in lines[1 + len(out):] if ln.startswith(prefix)]
    assert not rest, f"directives after the first command are ignored: {rest}"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # the script parses
    return out


def sbatch_directives(text: str) -> dict[str, str]:
    out = {}
    for d in directives(text, "#SBATCH"):
        m = re.fullmatch(r"--([a-z-]+)(?:=(\S+))?", d)
        assert m and m[1] in SBATCH_KEYS, d
        assert m[1] not in out, f"repeated {d}"
        out[m[1]] = m[2] or ""
    return out


def pbs_directives(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in directives(text, "#PBS"):
        opt, _, value = d.partition(" ")
        assert opt in PBS_OPTIONS and value and " " not in value, d
        if opt == "-l":
            key, _, v = value.partition("=")
            out[key] = v
        else:
            assert opt not in out, f"repeated {d}"
            out[opt] = value
    return out


def pbs_chunk(select: str) -> dict[str, int]:
    n, *parts = select.split(":")
    chunk = {"nodes": int(n)}
    for p in parts:
        k, v = p.split("=")
        chunk[k] = v if k == "mem" else int(v)
    return chunk


def run_args(text: str) -> list[str]:
    m = re.search(r"^RUN_ARGS=\((.*)\)$", text, re.M)
    return shlex.split(m[1])


# -- rendering ------------------------------------------------------------------------------------
@pytest.mark.parametrize("nodes,gpus", [(1, 1), (2, 4), (4, 2)])
@pytest.mark.single_process
def test_slurm_gpu_nodes(nodes, gpus):
    text = render(req(nodes=nodes, gpus_per_node=gpus, time="1-02:03:04", account="p42", partition="gpu",
                      qos="high", signal_margin=120))
    d = sbatch_directives(text)
    assert d["nodes"] == str(nodes) and d["ntasks-per-node"] == d["gpus-per-node"] == str(gpus)
    assert d["time"] == "1-02:03:04" and d["signal"] == "B:USR1@120"
    assert (d["account"], d["partition"], d["qos"]) == ("p42", "gpu", "high")
    assert "requeue" in d and d["open-mode"] == "append" and d["job-name"] == "cso-ackley"
    assert f"NRANKS={nodes * gpus}\n" in text
    assert "srun --mpi=pmi2 --nodes=\"$NNODES\" --ntasks=\"$NRANKS\"" in text and "--cpu-bind=cores" in text
    assert "no-kill" in d and f"NNODES={nodes}\n" in text
    assert "export HDF5_USE_FILE_LOCKING=FALSE" in text
    assert ("XLA_PYTHON_CLIENT_PREALLOCATE=false" in text) == (gpus > 1)
    assert run_args(text)[:2] == ["run", EXAMPLE]


@pytest.mark.single_process
def test_slurm_cpu_nodes_rank_per_core_group():
    text = render(req(nodes=2, ranks_per_node=4, cpus_per_rank=8, overrides=("parallel.threads_per_rank=8",),
                      launcher="mpiexec", launcher_args="-bind-to core:8"))
    d = sbatch_directives(text)
    assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("4", "8") and "gpus-per-node" not in d
    assert "export OMP_NUM_THREADS=8" in text and "SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-8}" in text
    assert 'LAUNCH=(mpiexec -n "$NRANKS" -bind-to core:8)' in text
    assert run_args(text)[2:4] == ["--set", "parallel.threads_per_rank=8"]


@pytest.mark.single_process
def test_slurm_pmix_and_seed_array():
    text = render(req(srun_mpi="pmix", seeds="0-9:3", overrides=("run.out=/scratch/x",)))
    d = sbatch_directives(text)
    assert d["array"] == "0-9:3" and d["output"] == "%x-%A_%a.out"
    assert "srun --mpi=pmix" in text
    # the array index becomes the seed and names the run (and its directory, when set)
    out = subprocess.run(["bash", "-c", _array_snippet(text) + 'printf "%s\\n" "${RUN_ARGS[@]}"'],
                         env={"SLURM_ARRAY_TASK_ID": "6", "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[-7:-1] == ["--set", "run.seed=6", "--set", "run.name=cso-ackley-seed6", "--set", "run.out=/scratch/x-seed6"]


def _array_snippet(text: str) -> str:
    start = text.index("RUN_ARGS=(")
    end = min(text.index(m) for m in ("# -- launcher", "# -- a node lost") if m in text)
    return "\n".join(ln for ln in text[start:end].splitlines() if not ln.startswith("export")) + "\n"


@pytest.mark.parametrize("nodes,gpus,rpn,cpus", [(2, 4, None, None), (2, 0, 16, 1), (3, 0, 2, 4)])
@pytest.mark.single_process
def test_pbs_directives(nodes, gpus, rpn, cpus):
    over = (f"parallel.threads_per_rank={cpus}",) if cpus else ()
    text = render(req("pbs", nodes=nodes, gpus_per_node=gpus, ranks_per_node=rpn, cpus_per_rank=cpus,
                      overrides=over, time="30h", account="p42", queue="workq", seeds="1-8"))
    d = pbs_directives(text)
    chunk = pbs_chunk(d["select"])
    per_node = rpn or gpus
    assert chunk["nodes"] == nodes and chunk["mpiprocs"] == per_node
    # a GPU rank's CPUs, the nodes' cores unknown here: 8 (a CPU rank's: its threads)
    assert chunk["ncpus"] == per_node * chunk["ompthreads"] == per_node * (cpus or (8 if gpus else 1))
    assert chunk["mem"] == f"{4 * chunk['ncpus']}gb"  # 4 GiB per CPU asked for
    assert chunk.get("ngpus", 0) == gpus
    assert d["walltime"] == "30:00:00" and d["place"] == "scatter"
    assert (d["-N"], d["-q"], d["-A"], d["-J"], d["-r"]) == ("cso-ackley", "workq", "p42", "1-8", "y")
    assert f"NRANKS={nodes * per_node}\n" in text
    assert 'LAUNCH=(mpiexec -n "$NRANKS" --machinefile "$PBS_NODEFILE")' in text
    assert 'cd "${PBS_O_WORKDIR:-.}"' in text
    # a resubmitted job continues; PBS warns of nothing, so the run stops itself before walltime,
    # counted from the job's start (this script's first line), not from hpcevo's
    assert run_args(text)[-1] == "--resume"
    assert f"JOB_END=$((JOB_START + {30 * 3600}))\nDEADLINE=$((JOB_END - 300))\n" in text
    assert text.index("JOB_START=$(date +%s)") < text.index('cd "${PBS_O_WORKDIR:-.}"')


@pytest.mark.single_process
def test_pbs_pals_launcher():
    text = render(req("pbs", nodes=2, gpus_per_node=4, launcher="pals"))
    assert 'LAUNCH=(mpiexec -n "$NRANKS" --ppn 4 --depth 8 --cpu-bind depth)' in text


@pytest.mark.single_process
def test_share_gpus_allows_more_ranks_than_gpus():
    text = render(req(nodes=1, gpus_per_node=2, ranks_per_node=4, overrides=("parallel.share_gpus=true",)))
    d = sbatch_directives(text)
    assert (d["ntasks-per-node"], d["gpus-per-node"]) == ("4", "2")


# -- refusals: exit 2 with a message that names the option --------------------------------------
@pytest.mark.parametrize("kw,message", [
    (dict(nodes=2, gpus_per_node=4, ranks=6), "--ranks 6 does not match --nodes 2 x 4 GPUs per node = 8"),
    (dict(nodes=2, ranks_per_node=3, ranks=4), "--ranks 4 does not match --nodes 2 x 3 ranks per node = 6"),
    (dict(gpus_per_node=4, ranks_per_node=8), "ranks per node must equal GPUs per node (4); to share"),
    (dict(gpus_per_node=4, ranks_per_node=2), "--ranks-per-node 2 with --gpus-per-node 4"),
    (dict(time="00:04:00", signal_margin=300), "--time 00:04:00 (240 s) is not longer than --signal-margin 300 s"),
    (dict(time="90"), "--time '90': not a time limit"),
    (dict(time="1:75:00"), "not a time limit"),
    (dict(launcher="aprun"), "--launcher 'aprun' for slurm: allowed: srun, mpiexec"),
    (dict(srun_mpi="pmi3"), "--srun-mpi 'pmi3': allowed: pmi2, pmix"),
    (dict(nodes=0), "--nodes 0: must be at least 1"),
    (dict(cpus_per_rank=4), "--cpus-per-rank 4 but"),
    (dict(account="my project"), "--account 'my project': letters, digits"),
    (dict(queue="workq"), "--queue is a PBS option"),
    (dict(gpus_per_node=2, overrides=("parallel.device='cpu'",)), "sets parallel.device = 'cpu'"),
    (dict(overrides=("algorithm.pop_sise=4",)), "algorithm.pop_sise"),
    (dict(config="/nonexistent.toml"), "config file '/nonexistent.toml' not found"),
])
@pytest.mark.single_process
def test_inconsistent_slurm_requests_are_refused(kw, message):
    with pytest.raises(UsageError) as e:
        render(req(**kw))
    assert message in str(e.value)


@pytest.mark.parametrize("kw,message", [
    (dict(seeds="1,2,3"), "--seeds '1,2,3': not a pbs array of seeds; allowed: FIRST-LAST[:STEP], FIRST < LAST"),
    (dict(seeds="4-4"), "not a pbs array"),
    (dict(partition="gpu"), "--partition and --qos are Slurm options"),
    (dict(launcher="srun"), "allowed: mpiexec, pals"),
    (dict(job_name="1st"), "PBS needs it to start with a letter"),
])
@pytest.mark.single_process
def test_inconsistent_pbs_requests_are_refused(kw, message):
    with pytest.raises(UsageError) as e:
        render(req("pbs", **kw))
    assert message in str(e.value)


# -- what an admin checks: CPUs, memory, the MPI plugin, the deadline, the comments ---------------
def _stand_in(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("#!/bin/sh\n" + body)
    (directory / name).chmod(0o755)


PBSNODES = """cat <<'EOT'
gpu01
     resources_available.ncpus = 72
     resources_available.mem = 515000mb
     resources_available.ngpus = 4

cpu01
     resources_available.ncpus = 8
     resources_available.mem = 64gb
EOT
"""


@pytest.mark.single_process
def test_gpu_ranks_get_the_nodes_cores_and_memory_in_proportion(tmp_path, monkeypatch):
    # given: 4 x 4 GPUs on nodes of 64 cores, 16 CPUs per GPU rank; memory 4 GiB per CPU
    d = sbatch_directives(render(req(nodes=4, gpus_per_node=4, cpus_per_node=64, time="12:00:00")))
    assert (d["ntasks-per-node"], d["cpus-per-task"], d["mem"]) == ("4", "16", "256G")
    # asked of the scheduler on the login node: Slurm's sinfo (GPU nodes only), PBS's pbsnodes
    _stand_in(tmp_path / "bin", "sinfo", 'echo "48 190000 gpu:4"; echo "128 500000 (null)"; echo "96+ 380000 gpu:a100:4"\n')
    _stand_in(tmp_path / "bin", "pbsnodes", PBSNODES)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    text = render(req(nodes=4, gpus_per_node=4, time="12:00:00"))
    d = sbatch_directives(text)
    assert (d["cpus-per-task"], d["mem"]) == ("12", "190000M")  # the smallest GPU node's 48 cores; capped at its memory
    assert "# 12 CPU(s) per rank: a node's 48 cores (sinfo -h -o %c %m %G) shared by its 4 ranks" in text
    assert "# 190000M of memory per node: a whole node's (--mem overrides)" in text
    assert "--cpus-per-task=12 --cpu-bind=cores" in text  # srun is told again
    chunk = pbs_chunk(pbs_directives(render(req("pbs", nodes=4, gpus_per_node=4)))["select"])
    assert (chunk["ncpus"], chunk["ompthreads"], chunk["mem"]) == (72, 18, "288gb")
    # overridden: --cpus-per-rank and --mem
    d = sbatch_directives(render(req(nodes=4, gpus_per_node=4, cpus_per_rank=6, mem="100G")))
    assert (d["cpus-per-task"], d["mem"]) == ("6", "100G")
    chunk = pbs_chunk(pbs_directives(render(req("pbs", gpus_per_node=2, mem="1536M")))["select"])
    assert chunk["mem"] == "1536mb" and chunk["ncpus"] == 72


@pytest.mark.single_process
def test_cpu_nodes_given_their_cores_are_filled_with_ranks():
    d = sbatch_directives(render(req(nodes=2, cpus_per_node=128, cpus_per_rank=4,
                                     overrides=("parallel.threads_per_rank=4",))))
    assert (d["ntasks-per-node"], d["cpus-per-task"], d["mem"]) == ("32", "4", "512G")
    with pytest.raises(UsageError, match="more than the 16 cores of --cpus-per-node"):
        render(req(cpus_per_node=16, ranks_per_node=32))
    for bad in ("0", "lots", "-5G"):
        with pytest.raises(UsageError, match="--mem"):
            render(req(mem=bad))


@pytest.mark.single_process
def test_srun_mpi_plugin_follows_the_mpi_that_mpi4py_runs(tmp_path):
    probe = ("import mpi4py; mpi4py.rc.initialize = False\n"
             "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])")
    ours = " ".join(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                   check=True).stdout.split())
    text = render(req(nodes=4, gpus_per_node=4))  # the job's python: this interpreter
    want = "pmix" if "open mpi" in ours.lower() else "pmi2"
    assert f"srun --mpi={want} " in text and f"# srun --mpi={want}: mpi4py runs {ours} (--srun-mpi overrides)" in text
    # an interpreter whose mpi4py runs Open MPI: pmix, said in a comment
    openmpi = tmp_path / "python-openmpi"
    openmpi.write_text('#!/bin/sh\necho "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6"\n')
    openmpi.chmod(0o755)
    text = render(req(nodes=4, gpus_per_node=4, python=str(openmpi)))
    assert "srun --mpi=pmix " in text and "mpi4py runs Open MPI v4.1.6, package: Debian OpenMPI" in text
    # one that cannot say: pmi2, and the script says why; --srun-mpi wins over both
    broken = tmp_path / "python-broken"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    text = render(req(python=str(broken)))
    assert "could not ask" in text and "srun --mpi=pmi2 " in text
    assert "srun --mpi=pmi2 " in render(req(python=str(openmpi), srun_mpi="pmi2"))
    # mpiexec needs no plugin, and PBS has no srun: no such line
    assert "srun --mpi" not in render(req(launcher="mpiexec")) + render(req("pbs"))


@pytest.mark.single_process
def test_scripts_speak_of_their_own_scheduler_and_of_arrays_only_when_asked():
    slurm, pbs = render(req(nodes=4, gpus_per_node=4, time="2h")), render(req("pbs", nodes=4, gpus_per_node=4, time="2h"))
    for text in (slurm, pbs):
        assert "array" not in text.lower() and "PBS_ARRAY_INDEX" not in text
    for word in ("Slurm", "sbatch", "srun", "scancel", "USR1@", "SLURM_"):
        assert word not in pbs, word
    for word in ("PBS", "qsub", "qdel"):
        assert word not in slurm, word
    assert "qdel" in pbs and "--signal=B:USR1@N" in slurm
    seeds = render(req("pbs", seeds="0-3"))
    assert "An array job, a seed sweep: subjob i runs seed i" in seeds and "PBS_ARRAY_INDEX" in seeds


def _deadline_of(text: str, env: dict[str, str], job_start: int) -> str:
    """The --deadline the script gives the run, its deadline block run by bash."""
    block = text[text.index("# -- the run's deadline"):text.index('RUN_ARGS+=(--deadline "@$DEADLINE")')]
    out = subprocess.run(["bash", "-c", f"set -u\nJOB_START={job_start}\n{block}\necho $DEADLINE"],
                         env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.single_process
def test_the_deadline_is_the_jobs_end_less_the_margin_and_never_after_render_deadline():
    slurm = render(req(nodes=4, gpus_per_node=4, time="02:00:00", signal_margin=300))
    # Slurm says when the job ends: that, less the margin
    assert _deadline_of(slurm, {"SLURM_JOB_END_TIME": "1800007200"}, 1800000100) == str(1800007200 - 300)
    # an older Slurm that does not: the job's start (the script's first line) + the limit
    assert _deadline_of(slurm, {}, 1800000000) == str(1800000000 + 7200 - 300)
    pbs = render(req("pbs", nodes=4, gpus_per_node=4, time="02:00:00", signal_margin=300))
    assert _deadline_of(pbs, {}, 1800000000) == str(1800000000 + 7200 - 300)
    # --deadline: a maintenance window at 2030-01-01 00:00 UTC (1893456000) ends the run before
    for text in (render(req(time="02:00:00", deadline="@1893456000")),
                 render(req("pbs", time="02:00:00", deadline="2030-01-01T00:00:00+00:00"))):
        assert _deadline_of(text, {}, 1893456000 - 3600) == "1893456000"  # the window comes first
        assert _deadline_of(text, {}, 1893456000 - 86400) == str(1893456000 - 86400 + 7200 - 300)
    for bad, message in (("90m", "give a time"), ("@1000", "has passed"), ("2030-13-01T00:00", "cannot read")):
        with pytest.raises(UsageError, match=message):
            render(req(deadline=bad))


@pytest.mark.single_process
def test_hpcevo_reads_an_epoch_deadline():
    from hpcevo.config import parse_deadline

    assert parse_deadline("@1893456000", now=5.0) == 1893456000.0
    assert parse_deadline("@1893456000.5", now=5.0) == 1893456000.5


@pytest.mark.launcher
def test_a_pbs_job_whose_set_up_is_slow_gives_the_run_the_jobs_deadline_not_one_from_its_own_start(tmp_path):
    """The prologue (module loads, here 3 s) runs before hpcevo starts; the deadline the ranks get
    is still the job's start + walltime - margin: hpcevo's own start would put it 3 s later."""
    import time as _time

    fake = fake_python(tmp_path)
    script = tmp_path / "job.pbs"
    script.write_text(render(req("pbs", ranks_per_node=2, python=str(fake), time="00:20:00", signal_margin=120,
                                 prologue=("sleep 3",), script_path=str(script))))
    env = pbs_env(tmp_path, 2, LOG_DIR=str(tmp_path), HPCEVO_RESUBMISSIONS="1")  # the fake exits 0 at once
    before = int(_time.time())
    done = subprocess.run(["bash", str(script)], env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "ranks.log").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        args = line.split()
        deadline = int(args[args.index("--deadline") + 1].lstrip("@"))
        # the job started at `before` (or the second after); the ranks started 3 s later
        assert before + 1200 - 120 <= deadline <= before + 1 + 1200 - 120, (before, deadline)

@pytest.mark.single_process
def test_time_formats():
    assert parse_time("2h") == parse_time("02:00:00") == parse_time("120m") == parse_time("2:00") == 7200
    assert parse_time("1-00:00:01") == 86401 and parse_time("45s") == 45
    assert plan(req(time="36h")).seconds == 36 * 3600


@pytest.mark.single_process
def test_rendered_examples_in_jobs_are_current(monkeypatch):
    """jobs/*: the README's 2-node examples, exactly what `hpcevo jobs render` writes today."""
    monkeypatch.chdir(ROOT)  # the recorded commands use paths relative to the repository
    paths = sorted((ROOT / "jobs").glob("*.[sp]b*"))
    assert len(paths) == 5
    for path in paths:
        first = path.read_text().splitlines()
        cmd = next(ln for ln in first if "rendered by: hpcevo jobs render" in ln).split("rendered by: hpcevo ")[1]
        from hpcevo.cli import _job_request, build_parser

        argv = shlex.split(cmd)
        args = build_parser().parse_args(argv)
        args.argv = argv
        got = render(dataclasses.replace(_job_request(args), script_path=args.out))
        assert got == path.read_text(), f"{path.name} is stale: run scripts/render-job-examples.sh"


# -- running a PBS script: bash, a simulated PBS environment, the local mpiexec -----------------
def pbs_env(tmp_path: Path, ranks: int, **extra) -> dict[str, str]:
    import socket

    nodefile = tmp_path / "nodefile"
    nodefile.write_text(f"{socket.gethostname()}\n" * ranks)
    fakebin = tmp_path / "bin"
    fakebin.mkdir(exist_ok=True)
    # qsub records how it was called and what script it was fed
    (fakebin / "qsub").write_text(
        '#!/bin/bash\nprintf "%s\\n" "$@" > "$PBS_O_WORKDIR/qsub.args"\ncat > "$PBS_O_WORKDIR/qsub.script"\n'
        'echo 124.sim\n')
    (fakebin / "qsub").chmod(0o755)
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PBS_NODEFILE=str(nodefile), PBS_O_WORKDIR=str(tmp_path), PBS_JOBID="123.sim",
               PBS_JOBNAME="cso-ackley", PBS_ENVIRONMENT="PBS_BATCH", PATH=f"{fakebin}:{env['PATH']}", **extra)
    return env


@pytest.mark.launcher
def test_pbs_script_runs_to_a_correct_summary(tmp_path):
    script = tmp_path / "job.pbs"
    gens = "run.generations=30"
    r = subprocess.run([sys.executable, "-m", "hpcevo", "jobs", "render", "pbs", EXAMPLE, "--ranks-per-node", "2",
                        "--time", "00:20:00", "--seeds", "0-3", "--set", gens, "--set", "log.every=10",
                        "--set", "run.out=runs/pbs", "-o", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    pbs_directives(script.read_text())
    done = subprocess.run(["bash", str(script)], env=pbs_env(tmp_path, 2, PBS_ARRAY_INDEX="3"),
                          cwd="/", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "ranks exited with code 0" in done.stderr
    summary = json.loads((tmp_path / "runs" / "pbs-seed3" / "summary.json").read_text())
    assert (summary["ranks"], summary["seed"], summary["name"]) == (2, 3, "cso-ackley-seed3")
    assert summary["evaluations"] == 1024 + 29 * 512
    # the same run started by hand on one rank has the same final state, bit for bit
    alone = tmp_path / "alone"
    r = subprocess.run([sys.executable, "-m", "hpcevo", "run", EXAMPLE, "--set", gens, "--set", "run.seed=3",
                        "--set", f"run.out={alone}", "-q"], capture_output=True, text=True, env=pbs_env(tmp_path, 1))
    assert r.returncode == 0, r.stderr
    assert json.loads((alone / "summary.json").read_text())["state_digest"] == summary["state_digest"]
    assert not (tmp_path / "qsub.args").exists()  # finished: nothing resubmitted


@pytest.mark.launcher
def test_job_takes_rank_0s_exit_code_when_the_launcher_reports_0(tmp_path):
    """MPICH's mpiexec can exit 0 after forwarding USR1 although the ranks exited 75 (seen: 32
    launches in 40 at one rank on a loaded machine). Here a stand-in mpiexec always loses the
    code; the job still sees 75, from the file rank 0 writes, and resubmits itself."""
    import shutil

    fake = fake_python(tmp_path)
    script = tmp_path / "job.pbs"
    script.write_text(render(req("pbs", ranks_per_node=2, seeds="0-3", python=str(fake), script_path=str(script))))
    env = pbs_env(tmp_path, 2, PBS_ARRAY_INDEX="2", LOG_DIR=str(tmp_path))
    (tmp_path / "bin" / "mpiexec").write_text(
        "#!/bin/bash\n"
        "trap 'kill -USR1 $child 2>/dev/null' USR1\n"
        f"{shlex.quote(shutil.which('mpiexec'))} \"$@\" &\nchild=$!\n"
        "while kill -0 $child 2>/dev/null; do wait $child; done\n"
        "exit 0\n")
    (tmp_path / "bin" / "mpiexec").chmod(0o755)
    returncode, err = _stop_with_usr1(script, env, tmp_path)
    assert returncode == 0, err
    assert sorted(rank_log(tmp_path)) == [["0", "0"], ["0", "USR1"], ["1", "0"], ["1", "USR1"]]
    assert "the launcher exited 0, but rank 0 exited 75" in err and "resubmitted as 124.sim" in err
    assert not list(tmp_path.glob(".hpcevo-exit.*"))  # the job cleans up after itself


@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_cli_records_its_exit_code_where_a_job_script_asks(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[algorithm]\nname = "nope"\n')
    exit_file = tmp_path / "exit"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "SLURM_"))}
    for args, want in (([str(EXAMPLE), "--set", "run.generations=2", "--set", f"run.out={tmp_path / 'run'}", "-q"], "0"),
                       ([str(bad)], "2")):
        r = subprocess.run([sys.executable, "-m", "hpcevo", "run", *args], capture_output=True, text=True,
                           env={**env, "HPCEVO_EXIT_FILE": str(exit_file)})
        assert r.returncode == int(want), r.stderr
        assert exit_file.read_text() == want + "\n"


@pytest.mark.launcher
def test_pbs_script_forwards_the_signal_and_resubmits_itself(tmp_path):
    """USR1 to the batch shell reaches every rank; exit 75 resubmits this script (no -J) after
    this job, telling it which subjob it continues and how many resubmissions were made."""
    fake = fake_python(tmp_path)
    script = tmp_path / "job.pbs"
    text = render(req("pbs", ranks_per_node=2, seeds="0-3", python=str(fake), script_path=str(script)))
    script.write_text(text)
    env = pbs_env(tmp_path, 2, PBS_ARRAY_INDEX="2", LOG_DIR=str(tmp_path))
    returncode, err = _stop_with_usr1(script, env, tmp_path)
    assert returncode == 0, err
    assert sorted(rank_log(tmp_path)) == [["0", "0"], ["0", "USR1"], ["1", "0"], ["1", "USR1"]]
    assert "ranks exited with code 75" in err and "resubmitted as 124.sim" in err
    args = (tmp_path / "qsub.args").read_text().splitlines()
    assert args == ["-v", f"HPCEVO_RESUBMISSIONS=1,HPCEVO_JOB_SCRIPT={script},HPCEVO_ARRAY_INDEX=2"]
    resubmitted = (tmp_path / "qsub.script").read_text()
    assert "-J" not in pbs_directives(resubmitted) and resubmitted == text.replace("#PBS -J 0-3\n", "")
    # the resubmitted job: the same subjob's seed, and it finishes (the fake rank exits 0)
    env = pbs_env(tmp_path, 2, LOG_DIR=str(tmp_path), HPCEVO_RESUBMISSIONS="1", HPCEVO_ARRAY_INDEX="2")
    (tmp_path / "qsub.args").unlink()
    done = subprocess.run(["bash", "-"], input=resubmitted, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "run.seed=2" in (tmp_path / "ranks.log").read_text().splitlines()[-1]
    assert not (tmp_path / "qsub.args").exists()


@pytest.mark.launcher
def test_a_pbs_chain_job_stopped_early_leaves_the_resume_to_the_next_job_and_runs_no_qsub(tmp_path):
    """Sites that forbid qsub on compute nodes: with HPCEVO_CHAIN set (`--resubmit chain`), a job
    stopped early exits 75 (so that the next job, waiting afternotok, starts) and submits nothing."""
    fake = fake_python(tmp_path)
    script = tmp_path / "job.pbs"
    script.write_text(render(req("pbs", ranks_per_node=2, python=str(fake), script_path=str(script))))
    returncode, err = _stop_with_usr1(script, pbs_env(tmp_path, 2, LOG_DIR=str(tmp_path), HPCEVO_CHAIN="1"), tmp_path)
    assert returncode == 75, err
    assert "the next job of the chain resumes from the checkpoint" in err
    assert not (tmp_path / "qsub.args").exists()


@pytest.mark.single_process
def test_submit_queues_a_pbs_chain_up_front(tmp_path, monkeypatch):
    from hpcevo.jobs import submit

    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "qsub", f'n=$(cat "{tmp_path}/n" 2>/dev/null || echo 0); echo $((n + 1)) > "{tmp_path}/n"\n'
                               f'echo "$*" >> "{tmp_path}/qsub.calls"; echo "$((n + 100)).pbs01"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    script = tmp_path / "job.pbs"
    out = submit(req("pbs", resubmit="chain", max_requeues=3), script)
    assert out == "100.pbs01 (and 3 chained after it, the last 103.pbs01)"
    calls = (tmp_path / "qsub.calls").read_text().splitlines()
    var = f"HPCEVO_JOB_SCRIPT={script}"
    assert calls == [f"-v {var},HPCEVO_CHAIN=1 {script}",
                     *(f"-W depend=afternotok:{99 + i}.pbs01 -v {var},HPCEVO_CHAIN=1,HPCEVO_RESUBMISSIONS={i} {script}"
                       for i in (1, 2, 3))]
    for bad in (req(resubmit="chain"), req("pbs", resubmit="chain", seeds="0-3"), req("pbs", resubmit="later")):
        with pytest.raises(UsageError, match="--resubmit"):
            render(bad)


def _stop_with_usr1(script: Path, env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """Start the job script, wait until both stand-in ranks run, send SIGUSR1 to the batch shell
    only (as the scheduler does); the job's exit code and stderr."""
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: started(tmp_path, 2), job)
        job.send_signal(10)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    return job.returncode, err


def _wait_for(ready, proc, timeout=60.0):
    import time

    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.1)


@pytest.mark.single_process
def test_submit_writes_the_script_and_prints_the_job_id(tmp_path, monkeypatch):
    from hpcevo.jobs import submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, answer in (("sbatch", "4242;cluster"), ("qsub", "77.pbs01")):
        (bin_dir / tool).write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > "{tmp_path}/{tool}.args"\necho "{answer}"\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    script = tmp_path / "sub" / "job.sbatch"
    assert submit(req(output=str(tmp_path / "logs" / "%x-%j.out")), script) == "4242"
    assert (tmp_path / "sbatch.args").read_text().split() == ["--parsable", str(script)]
    assert script.read_text().startswith("#!/bin/bash\n#SBATCH") and (tmp_path / "logs").is_dir()
    script = tmp_path / "job.pbs"
    assert submit(req("pbs"), script) == "77.pbs01"
    assert (tmp_path / "qsub.args").read_text().split() == ["-v", f"HPCEVO_JOB_SCRIPT={script}", str(script)]
    assert f"JOB_SCRIPT=${{HPCEVO_JOB_SCRIPT:-{script}}}" in script.read_text()
    monkeypatch.setenv("PATH", str(bin_dir / "none"))
    with pytest.raises(UsageError, match="sbatch not found: submit from a slurm login node"):
        submit(req(), tmp_path / "x.sbatch")


@pytest.mark.single_process
def test_cli_refuses_with_exit_2_and_one_message(capsys):
    from hpcevo.cli import main

    assert main(["jobs", "render", "slurm", EXAMPLE, "--time", "1h", "--nodes", "2", "--gpus-per-node", "4",
                 "--ranks", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcevo: error: --ranks 4 does not match --nodes 2 x 4 GPUs per node = 8")
    assert main(["jobs", "render", "lsf", EXAMPLE, "--time", "1h"]) == 2
    assert "invalid choice: 'lsf'" in capsys.readouterr().err


# -- values that must stay values ---------------------------------------------------------------------
HOSTILE = ["a\nb", "run.name=x\ntouch {pwned}", "it's \"quoted\"", "$(touch {pwned})", "`touch {pwned}`",
           "a; touch {pwned}", "back\\slash", "${{HOME}}", "tab\there", "x' ; touch {pwned} ; '"]


def recording_launcher(path: Path) -> None:
    """A stand-in srun/mpiexec that writes the command it was asked to start, one argument per
    NUL-terminated field, and exits 0."""
    path.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$LAUNCH_LOG"\n')
    path.chmod(0o755)


@pytest.mark.single_process
@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_hostile_values_stay_values_in_a_rendered_script(tmp_path, scheduler, capsys):
    """Newlines, quotes, $(...), backticks and the like in every value that reaches the script:
    the script parses (bash -n), has the lines a plain request gives (no value became a line of
    its own), and run with stand-ins it starts the run with each value byte for byte, having
    executed none of them."""
    from hpcevo.cli import main

    pwned = tmp_path / "PWNED"
    weird = tmp_path / "dir with 'quotes' $(touch PWNED) `touch PWNED`"
    weird.mkdir()
    config = weird / "c $(touch PWNED).toml"
    config.write_text(Path(EXAMPLE).read_text())
    python = weird / "py$(touch PWNED)thon"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    sets = [f"run.out={v.format(pwned=pwned)}" for v in HOSTILE]  # (a key that takes any text)
    launcher_args = f"--extra '$(touch {pwned})' \"`touch {pwned}`\""

    def render_cli(values: list[str], cfg: Path, py: Path, workdir: Path, args: str) -> str:
        argv = ["jobs", "render", scheduler, str(cfg), "--time", "1h", "--python", str(py), "--workdir", str(workdir),
                "--launcher-args", args]
        for v in values:
            argv += ["--set", v]
        assert main(argv) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    text = render_cli(sets, config, python, weird, launcher_args)
    plain = render_cli([f"run.out=n{i}" for i in range(len(sets))], Path(EXAMPLE), python, weird, "--x y")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert len(text.splitlines()) == len(plain.splitlines())
    assert [ln for ln in text.splitlines() if ln.startswith("#")][1:] != []  # (directives and comments are there)
    script = tmp_path / "job.sh"
    script.write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    recording_launcher(bindir / ("srun" if scheduler == "slurm" else "mpiexec"))
    env = pbs_env(tmp_path, 1) if scheduler == "pbs" else {**clean_env(), "SLURM_JOB_ID": "7"}
    env.update(PATH=f"{bindir}:{env['PATH']}", LAUNCH_LOG=str(tmp_path / "launch.log"))
    done = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    started = (tmp_path / "launch.log").read_bytes().split(b"\0")[:-1]
    args = [a.decode() for a in started]
    i = args.index(str(python))
    assert args[:i][-3:] == ["--extra", f"$(touch {pwned})", f"`touch {pwned}`"]
    assert args[i + 1:i + 4] == ["-m", "hpcevo", "run"] and args[i + 4] == str(config)
    assert [args[j + 1] for j in range(i + 5, len(args)) if args[j] == "--set"] == sets
    assert not list(tmp_path.rglob("PWNED"))


def clean_env() -> dict[str, str]:
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.mark.single_process
@pytest.mark.parametrize("option", ["--cpus-per-rank", "--ranks-per-node", "--ranks"])
def test_zero_is_refused_not_taken_for_the_default(option, capsys):
    from hpcevo.cli import main

    assert main(["jobs", "render", "slurm", EXAMPLE, "--time", "1h", option, "0"]) == 2
    assert capsys.readouterr().err == f"hpcevo: error: {option} 0: must be at least 1\n"


@pytest.mark.single_process
@pytest.mark.parametrize("kw, message", [
    ({"output": "a b.out"}, "--output 'a b.out': a path without spaces"),
    ({"output": "$(id).out"}, "--output"),
    ({"workdir": "a\nb"}, "--workdir"),
    ({"prologue": ("module load x\nrm -rf ~",)}, "--prologue"),
    ({"launcher_args": "-x 'unclosed"}, "--launcher-args"),
    ({"job_name": "a;b"}, "--job-name"),
])
def test_values_that_cannot_stay_values_are_refused(kw, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        render(req(**kw))


# -- a node lost: the Slurm job goes on with the nodes left ------------------------------------
FAKE_SRUN = """#!/bin/bash
# A probe step (-w NODE true) answers unless NODE is in $DEAD; a launch logs its arguments and
# plays the run: the first ends as hpcevo's watchdog ends it after losing $LOST (exit 76, the
# exit file, the lost hosts), later ones complete.
args="$*"
if [ "${@: -1}" = true ]; then
  node=$(echo "$args" | sed -n 's/.* -w \\([^ ]*\\) .*/\\1/p')
  case " $DEAD " in *" $node "*) exit 1 ;; esac
  exit 0
fi
echo "$args" >> "$LOG_DIR/launches.log"
if [ "$(wc -l < "$LOG_DIR/launches.log")" -le "${FAILS:-1}" ]; then
  printf '%s\\n' $LOST > "$HPCEVO_EXIT_FILE.lost"
  echo 76 > "$HPCEVO_EXIT_FILE"
  exit 137
fi
exit 0
"""
FAKE_SCONTROL = """#!/bin/bash
case "$1" in
  show) echo node1; echo node2; echo node3 ;;
  requeue) echo "requeue $2" >> "$LOG_DIR/requeue.log" ;;
esac
"""


def run_slurm_job(tmp_path: Path, lost: str, dead: str = "", fails: int = 1, **kw) -> tuple[int, str, list[str]]:
    """The rendered 3-node job under bash with a stand-in srun and scontrol."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render(req(nodes=3, ranks_per_node=2, **kw)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "HYDRA_"))}
    env.update(PATH=f"{bin_}:{env['PATH']}", LOG_DIR=str(tmp_path), LOST=lost, DEAD=dead, FAILS=str(fails),
               SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node[1-3]", SLURM_RESTART_COUNT="0")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    launches = (tmp_path / "launches.log").read_text().splitlines()
    return r.returncode, r.stderr, launches


@pytest.mark.single_process
def test_slurm_job_relaunches_on_the_nodes_left_excluding_the_lost_ones(tmp_path):
    """node2 named lost by the watchdog, node3 not answering a probe: the run is relaunched, with
    --overlap (the lost step may still hold the CPUs), on node1 alone at its rank count."""
    text = render(req(nodes=3, ranks_per_node=2))
    assert "#SBATCH --no-kill" in text and "#SBATCH --requeue" in text
    rc, err, launches = run_slurm_job(tmp_path, lost="node2", dead="node3")
    assert rc == 0, err
    assert len(launches) == 2
    assert "--nodes=3 --ntasks=6 " in launches[0] and "--overlap" not in launches[0]
    assert "--nodes=1 --ntasks=2 --ntasks-per-node=2" in launches[1]
    assert "--overlap --exclude=node2,node3" in launches[1] and "--resume" in launches[1]
    assert "lost: node2 node3; still answering: node1" in err
    assert "relaunch 1 of at most 3: 2 ranks on 1 node(s) (node1)" in err
    assert not (tmp_path / "requeue.log").exists()
    assert not list(tmp_path.glob(".hpcevo-exit.*"))


@pytest.mark.single_process
def test_slurm_job_requeues_when_fewer_than_min_nodes_are_left_or_relaunches_are_spent(tmp_path):
    (tmp_path / "a").mkdir()
    rc, err, launches = run_slurm_job(tmp_path / "a", lost="node2", min_nodes=3)
    assert rc == 0 and len(launches) == 1, err
    assert "fewer than 3 node(s) left (--min-nodes): requeueing instead" in err
    assert (tmp_path / "a" / "requeue.log").read_text() == "requeue 7\n"
    (tmp_path / "b").mkdir()
    rc, err, launches = run_slurm_job(tmp_path / "b", lost="node3", fails=9, max_relaunches=2)
    assert len(launches) == 3 and "2 relaunches done (--max-relaunches): requeueing instead" in err, err
    assert (tmp_path / "b" / "requeue.log").read_text() == "requeue 7\n"


@pytest.mark.single_process
def test_slurm_job_does_not_relaunch_when_no_node_was_lost(tmp_path):
    """Exit 76 with every node answering (a rank stuck in the problem's code): the run's own
    failure, which a relaunch would repeat. Without relaunches the job has no --no-kill."""
    rc, err, launches = run_slurm_job(tmp_path, lost="")
    assert rc == 76 and len(launches) == 1, err
    assert "relaunch" not in err.replace("relaunches", "")
    text = render(req(nodes=3, ranks_per_node=2, max_relaunches=0))
    assert "#SBATCH --no-kill" not in text and "MAX_RELAUNCHES=0" in text
    assert "#SBATCH --no-kill" not in render(req(nodes=2, launcher="mpiexec"))
    with pytest.raises(UsageError, match="--min-nodes 4: must be between 1 and --nodes"):
        render(req(nodes=3, min_nodes=4))
