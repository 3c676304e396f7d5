"""Batch job scripts for Slurm and PBS Pro: render from a run config, check, submit.

``render(JobRequest)`` fills the templates in ``templates/`` (bash with ``@name@`` slots, so
bash's own ``$`` needs no escaping) and returns a ready-to-submit script: resources, time limit,
the environment that matters, the launcher, the warning signal trapped and forwarded to the
ranks, and the requeue loop (exit 75 -> ``scontrol requeue`` on Slurm, a dependent resubmission
on PBS) with ``--resume``. Every inconsistency in the request is a UsageError (exit 2) that
names the option and what is allowed; nothing here initialises MPI, so it runs on login nodes.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Literal

from ..errors import UsageError

SCHEDULERS = ("slurm", "pbs")
LAUNCHERS = {"slurm": ("srun", "mpiexec"), "pbs": ("mpiexec", "pals")}
SRUN_MPI = ("pmi2", "pmix")
# A GPU rank's CPUs when the node's cores are not known: XLA compiles and the host side of a run
# (checkpoints, logs, the evaluation of host problems) use them; one was far too few.
GPU_RANK_CPUS = 8
MEM_PER_CPU_MIB = 4096  # the default memory request: 4 GiB for each CPU the job asks for


@dataclasses.dataclass(frozen=True)
class JobRequest:
    scheduler: Literal["slurm", "pbs"]
    config: str
    time: str  # [D-]HH:MM:SS, HH:MM, or 90m / 2h / 1d / 3600s
    nodes: int = 1
    ranks_per_node: int | None = None  # default: one per GPU, else 1
    gpus_per_node: int = 0  # 0: CPU nodes
    cpus_per_rank: int | None = None  # default: the config's threads_per_rank (or 1)
    ranks: int | None = None  # total; checked against nodes x ranks_per_node
    cpus_per_node: int | None = None  # the node's cores (default: asked of sinfo / pbsnodes)
    mem: str | None = None  # memory per node, e.g. 64G (default: MEM_PER_CPU_MIB per CPU asked for)
    signal_margin: int = 300  # seconds before the limit: Slurm's warning signal / PBS deadline
    account: str | None = None
    partition: str | None = None  # Slurm
    qos: str | None = None  # Slurm
    queue: str | None = None  # PBS
    launcher: str | None = None  # slurm: srun | mpiexec; pbs: mpiexec | pals
    srun_mpi: str | None = None  # default: from the MPI that the job's mpi4py runs
    deadline: str | None = None  # an absolute time the run must stop before (besides the time limit)
    launcher_args: str = ""
    seeds: str | None = None  # array spec: 0-9, 0-9:2 (Slurm also 1,5,7)
    study: bool = False  # config is a study file: the job runs `hpcevo study run` on it
    array: int | None = None  # a study as this many array tasks, each running its slice of the runs
    output: str | None = None  # log file
    job_name: str | None = None
    python: str = sys.executable
    overrides: tuple[str, ...] = ()
    max_requeues: int = 10
    # PBS: "self" (the job qsubs its successor at exit 75) or "chain" (submit queues the successors
    # up front, each waiting on the one before failing: for sites without qsub on compute nodes)
    resubmit: str = "self"
    min_nodes: int = 1  # Slurm: a node lost, the run goes on with the rest if at least this many
    max_relaunches: int = 3  # Slurm: relaunches on the nodes left in one allocation (0: requeue)
    workdir: str | None = None
    prologue: tuple[str, ...] = ()  # site lines, e.g. "module load cuda"
    script_path: str | None = None  # where the script will live (PBS resubmits it)
    command: str = ""  # how it was rendered, recorded in the script


_TOKEN = re.compile(r"^[A-Za-z0-9_.@:+/-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ARRAY = re.compile(r"^(\d+)-(\d+)(?::(\d+))?$")


def parse_time(text: str, option: str = "--time") -> int:
    """Seconds in a time limit: [D-]HH:MM:SS, HH:MM, or a number with a unit (s, m, h, d)."""
    t = text.strip()
    m = re.fullmatch(r"(\d+)([smhd])", t)
    if m:
        return int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?", t)
    if m and int(m[3]) < 60 and int(m[4] or 0) < 60:
        days, hours, minutes, seconds = int(m[1] or 0), int(m[2]), int(m[3]), int(m[4] or 0)
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    raise UsageError(
        f"{option} {text!r}: not a time limit; use [D-]HH:MM:SS, HH:MM or a number with a unit "
        "(90m, 2h, 1d, 3600s). A bare number is minutes to Slurm and seconds to PBS: say which"
    )


def hms(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    return f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"


def _seed_indices(spec: str, scheduler: str) -> list[int]:
    m = _ARRAY.fullmatch(spec)
    if m:
        lo, hi, step = int(m[1]), int(m[2]), int(m[3] or 1)
        if lo <= hi and step >= 1 and (scheduler == "slurm" or lo < hi):
            return list(range(lo, hi + 1, step))
    elif scheduler == "slurm" and re.fullmatch(r"\d+(,\d+)+", spec):
        return [int(x) for x in spec.split(",")]
    allowed = "FIRST-LAST[:STEP], FIRST < LAST" if scheduler == "pbs" else "FIRST-LAST[:STEP] or a list 1,4,9"
    raise UsageError(f"--seeds {spec!r}: not a {scheduler} array of seeds; allowed: {allowed}")


def _check_token(value: str | None, option: str) -> None:
    if value is not None and not _TOKEN.match(value):
        raise UsageError(f"{option} {value!r}: letters, digits and _ . @ : + / - only")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request checked against itself and the run config, with every default resolved."""

    req: JobRequest
    name: str  # run name (and default job name)
    out: str | None  # run.out, when the config or --set sets one
    ranks_per_node: int
    cpus_per_rank: int
    seconds: int
    launcher: str
    seeds: list[int] | None
    array: str | None = None  # the scheduler's array range (a seed sweep's, or a study's slices)
    mem_mib: int = 0  # memory per node
    srun_mpi: str = "pmi2"
    deadline_at: int | None = None  # --deadline as an epoch time
    notes: tuple[str, ...] = ()  # where the resources came from, for the script's header

    @property
    def nranks(self) -> int:
        return self.req.nodes * self.ranks_per_node


def plan(req: JobRequest) -> Plan:
    """Check a request; raise UsageError naming the option and what is allowed."""
    from ..api import load_config

    if req.scheduler not in SCHEDULERS:
        raise UsageError(f"scheduler {req.scheduler!r}: allowed: {', '.join(SCHEDULERS)}")
    study = _study_of(req)
    cfg = study.runs[0].config() if study else load_config(req.config, req.overrides)  # ConfigError names the key
    _check_counts(req)
    gpus = req.gpus_per_node
    if gpus and cfg.parallel.device == "cpu":
        raise UsageError(f"--gpus-per-node {gpus}, but {req.config} sets parallel.device = 'cpu'")
    threads = cfg.parallel.threads_per_rank
    # A CPU rank's CPUs are its threads; a CPU node given its cores is filled with such ranks.
    cpu_rank = req.cpus_per_rank if req.cpus_per_rank is not None else (threads if isinstance(threads, int) else 1)
    if req.ranks_per_node is not None:
        rpn = req.ranks_per_node
    elif gpus:
        rpn = gpus
    else:
        rpn = max(1, req.cpus_per_node // cpu_rank) if req.cpus_per_node else 1
    if gpus and rpn != gpus and not (rpn > gpus and cfg.parallel.share_gpus):
        raise UsageError(
            f"--ranks-per-node {rpn} with --gpus-per-node {gpus}: hpcevo runs one rank per GPU, so "
            f"ranks per node must equal GPUs per node ({gpus})"
            + ("; to share GPUs among more ranks set parallel.share_gpus = true" if rpn > gpus else "")
        )
    if req.ranks is not None and req.ranks != req.nodes * rpn:
        per = f"{gpus} GPUs" if gpus else f"{rpn} ranks"
        raise UsageError(
            f"--ranks {req.ranks} does not match --nodes {req.nodes} x {per} per node = "
            f"{req.nodes * rpn}; change --nodes, --ranks-per-node or --gpus-per-node"
        )
    notes: list[str] = []
    cpus, node_mib = _cpus_per_rank(req, rpn, cpu_rank, notes)
    if req.cpus_per_node and rpn * cpus > req.cpus_per_node:
        raise UsageError(f"{rpn} ranks per node x {cpus} CPUs per rank = {rpn * cpus}: more than the "
                         f"{req.cpus_per_node} cores of --cpus-per-node; lower --ranks-per-node or --cpus-per-rank")
    if not gpus and isinstance(threads, int) and cpus != threads:
        raise UsageError(
            f"--cpus-per-rank {cpus} but {req.config} caps each rank at parallel.threads_per_rank = "
            f"{threads}: make them agree (--set parallel.threads_per_rank={cpus}, or "
            "'auto' to use the CPUs each rank is bound to)"
        )
    seconds = parse_time(req.time)
    if seconds <= req.signal_margin:
        raise UsageError(
            f"--time {req.time} ({seconds} s) is not longer than --signal-margin {req.signal_margin} s: "
            "the run would be told to checkpoint before it starts; raise --time or lower the margin"
        )
    launcher = req.launcher or LAUNCHERS[req.scheduler][0]
    if launcher not in LAUNCHERS[req.scheduler]:
        raise UsageError(
            f"--launcher {launcher!r} for {req.scheduler}: allowed: {', '.join(LAUNCHERS[req.scheduler])}"
        )
    srun_mpi = _srun_mpi(req, launcher, notes)
    mem_mib = _memory(req, rpn * cpus, node_mib, notes)
    deadline_at = _deadline(req)
    for value, option in ((req.account, "--account"), (req.partition, "--partition"), (req.qos, "--qos"),
                          (req.queue, "--queue"), (req.job_name, "--job-name")):
        _check_token(value, option)
    if req.scheduler == "pbs" and (req.partition or req.qos):
        raise UsageError("--partition and --qos are Slurm options; PBS takes --queue")
    if req.scheduler == "slurm" and req.queue:
        raise UsageError("--queue is a PBS option; Slurm takes --partition (and --qos)")
    job_name = req.job_name or cfg.run.name
    if req.scheduler == "pbs" and not job_name[0].isalpha():
        raise UsageError(f"job name {job_name!r}: PBS needs it to start with a letter (--job-name)")
    _check_texts(req)
    seeds = _seed_indices(req.seeds, req.scheduler) if req.seeds else None
    if study is not None:
        _check_study(req, study, req.nodes * rpn)
        array = f"0-{req.array - 1}" if req.array else None
        return Plan(req, study.name, str(study.out), rpn, cpus, seconds, launcher, None, array, mem_mib, srun_mpi,
                    deadline_at, tuple(notes))
    return Plan(req, cfg.run.name, cfg.run.out, rpn, cpus, seconds, launcher, seeds, req.seeds, mem_mib, srun_mpi,
                deadline_at, tuple(notes))


def _check_counts(req: JobRequest) -> None:
    if req.resubmit not in ("self", "chain"):
        raise UsageError(f"--resubmit {req.resubmit!r}: allowed: self, chain")
    if req.resubmit == "chain" and (req.scheduler != "pbs" or req.seeds or req.array):
        raise UsageError("--resubmit chain is for a PBS job that is not an array (Slurm requeues a job itself; "
                         "an array's subjobs resubmit themselves)")
    for value, option in ((req.nodes, "--nodes"), (req.signal_margin, "--signal-margin")):
        if value < 1:
            raise UsageError(f"{option} {value}: must be at least 1")
    if req.max_requeues < 0:
        raise UsageError(f"--max-requeues {req.max_requeues}: must be 0 (never requeue) or more")
    if req.max_relaunches < 0:
        raise UsageError(f"--max-relaunches {req.max_relaunches}: must be 0 (requeue when a node is lost) or more")
    if not 1 <= req.min_nodes <= req.nodes:
        raise UsageError(f"--min-nodes {req.min_nodes}: must be between 1 and --nodes ({req.nodes}): the fewest "
                         "nodes a run goes on with after losing some")
    if req.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node {req.gpus_per_node}: must be 0 (CPU nodes) or more")
    for value, option in ((req.ranks_per_node, "--ranks-per-node"), (req.cpus_per_rank, "--cpus-per-rank"),
                          (req.ranks, "--ranks"), (req.cpus_per_node, "--cpus-per-node")):
        if value is not None and value < 1:  # (0 must not fall back to a default: say so)
            raise UsageError(f"{option} {value}: must be at least 1")


# -- what the request leaves out, found or defaulted ----------------------------------------------
def _cpus_per_rank(req: JobRequest, rpn: int, cpu_rank: int, notes: list[str]) -> tuple[int, int | None]:
    """A rank's CPUs, and a node's memory (MiB) where the scheduler said it. The scheduler is
    asked about its nodes when a default needs them: a GPU rank's CPUs (a node's cores shared by
    its ranks) and the memory request (never more than a node has)."""
    gpus = req.gpus_per_node
    gpu_cpus_unknown = gpus and req.cpus_per_rank is None and req.cpus_per_node is None
    probed, node_mib, why = node_resources(req) if gpu_cpus_unknown or req.mem is None else (None, None, "")
    node_cores = probed if gpu_cpus_unknown else req.cpus_per_node
    if req.cpus_per_node is not None:
        why = "--cpus-per-node"
    if not gpus or req.cpus_per_rank is not None:
        return cpu_rank, node_mib
    if node_cores:
        cpus = max(1, node_cores // rpn)
        notes.append(f"{cpus} CPU(s) per rank: a node's {node_cores} cores ({why}) shared by its {rpn} ranks")
        return cpus, node_mib
    notes.append(f"{GPU_RANK_CPUS} CPUs per GPU rank: the nodes' cores are unknown ({why}); "
                 "--cpus-per-node or --cpus-per-rank sets them")
    return GPU_RANK_CPUS, node_mib


def _srun_mpi(req: JobRequest, launcher: str, notes: list[str]) -> str:
    if req.srun_mpi is not None and req.srun_mpi not in SRUN_MPI:
        raise UsageError(f"--srun-mpi {req.srun_mpi!r}: allowed: {', '.join(SRUN_MPI)}")
    if req.scheduler != "slurm" or launcher != "srun":
        return req.srun_mpi or "pmi2"
    if req.srun_mpi:
        notes.append(f"srun --mpi={req.srun_mpi}: as --srun-mpi asks")
        return req.srun_mpi
    plugin, said = srun_plugin(req.python)
    notes.append(f"srun --mpi={plugin}: {said} (--srun-mpi overrides)")
    return plugin


def node_resources(req: JobRequest) -> tuple[int | None, int | None, str]:
    """(cores, memory in MiB) of the smallest node the job may get, as the scheduler's own
    command on this (login) node reports them, and where that came from; (None, None, why)
    when it cannot say (no such command, no answer within seconds)."""
    if req.scheduler == "slurm":
        cmd = ["sinfo", "-h", "-o", "%c %m %G"] + (["-p", req.partition] if req.partition else [])
    else:
        cmd = ["pbsnodes", "-av"]
    if shutil.which(cmd[0]) is None:
        return None, None, f"no {cmd[0]} here"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None, f"{cmd[0]} did not answer"
    if done.returncode != 0:
        return None, None, f"{cmd[0]} failed"
    nodes: list[tuple[int, int | None]] = []
    if req.scheduler == "slurm":
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) < 2 or (req.gpus_per_node and "gpu" not in " ".join(parts[2:])):
                continue
            cores, mem = (re.match(r"\d+", x) for x in parts[:2])  # "64+": at least 64
            if cores:
                nodes.append((int(cores[0]), int(mem[0]) if mem else None))
    else:
        for block in re.split(r"\n(?=\S)", done.stdout):
            got = dict(re.findall(r"resources_available\.(ncpus|mem|ngpus) = (\S+)", block))
            if "ncpus" not in got or int(got.get("ngpus", "0") or 0) < req.gpus_per_node:
                continue
            nodes.append((int(got["ncpus"]), _pbs_mib(got.get("mem", ""))))
    if not nodes:
        return None, None, f"{' '.join(cmd)} listed no {'GPU ' if req.gpus_per_node else ''}nodes"
    cores = min(c for c, _ in nodes)
    mems = [m for _, m in nodes if m]
    return cores, (min(mems) if mems else None), " ".join(cmd)


def _pbs_mib(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)(b|kb|mb|gb|tb)?", text.strip().lower())
    if not m:
        return None
    scale = {"b": 1 / 2**20, "kb": 1 / 1024, "mb": 1, "gb": 1024, "tb": 2**20}[m[2] or "b"]
    return int(int(m[1]) * scale)


def parse_memory(text: str) -> int:
    """MiB in a memory amount as Slurm writes it: 500M, 64G, 1T (a bare number: MiB)."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:i?B)?", text.strip(), re.I)
    if not m or int(m[1]) == 0:
        raise UsageError(f"--mem {text!r}: memory per node as 500M, 64G or 1T (more than 0)")
    mib = int(m[1]) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 2**20}[m[2].upper()]
    if mib < 1:
        raise UsageError(f"--mem {text!r}: less than 1 MiB")
    return int(mib)


def _memory(req: JobRequest, cpus: int, node_mib: int | None, notes: list[str]) -> int:
    """The memory per node: --mem, else MEM_PER_CPU_MIB per CPU asked for (at most a node's)."""
    if req.mem is not None:
        mib = parse_memory(req.mem)
        notes.append(f"{_mem_text(mib, req.scheduler)} of memory per node: as --mem asks")
        return mib
    mib = cpus * MEM_PER_CPU_MIB
    capped = node_mib is not None and mib > node_mib
    if capped:
        mib = node_mib  # type: ignore[assignment]
    notes.append(f"{_mem_text(mib, req.scheduler)} of memory per node: "
                 + ("a whole node's" if capped else f"{MEM_PER_CPU_MIB // 1024} GiB for each of its {cpus} CPUs")
                 + " (--mem overrides)")
    return mib


def _mem_text(mib: int, scheduler: str = "slurm") -> str:
    """As the scheduler writes it: 64G / 500M (Slurm), 64gb / 500mb (PBS)."""
    g, m = ("G", "M") if scheduler == "slurm" else ("gb", "mb")
    return f"{mib // 1024}{g}" if mib % 1024 == 0 else f"{mib}{m}"


_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
          "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())")
_PLUGINS: dict[str, tuple[str, str]] = {}


def srun_plugin(python: str) -> tuple[str, str]:
    """srun's --mpi plugin for the MPI that ``python``'s mpi4py runs (asked of it without
    initialising MPI: this runs on login nodes), and a line saying why. Open MPI talks PMIx
    (Open MPI 5 only that); MPICH, Intel MPI and MVAPICH take pmi2."""
    if python not in _PLUGINS:
        try:
            done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
            library = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
            library = " ".join(library.split())  # (MPICH's has a tab)
        except (OSError, subprocess.SubprocessError):
            library = ""
        if not library:
            _PLUGINS[python] = ("pmi2", f"could not ask {python} which MPI its mpi4py runs; pmi2, MPICH's")
        elif "open mpi" in library.lower():
            _PLUGINS[python] = ("pmix", f"mpi4py runs {library}, which talks PMIx")
        else:
            _PLUGINS[python] = ("pmi2", f"mpi4py runs {library}")
    return _PLUGINS[python]


def _deadline(req: JobRequest) -> int | None:
    """--deadline as an epoch time: an absolute time only (the job may wait in the queue)."""
    if req.deadline is None:
        return None
    from ..config import parse_deadline

    text = req.deadline.strip()
    absolute = text.startswith("@") or re.search(r"\d{4}-\d{2}-\d{2}", text)
    if not absolute:
        raise UsageError(f"--deadline {req.deadline!r}: give a time (2026-11-28T06:00, or @EPOCH): the job may "
                         "wait in the queue, and --time already bounds it from its start")
    try:
        at = parse_deadline(text, time.time())
    except ValueError as e:
        raise UsageError(f"--deadline: {e}") from None
    if at <= time.time():
        raise UsageError(f"--deadline {req.deadline!r} has passed")
    return int(at)


def _study_of(req: JobRequest):
    """The study ``req.config`` holds (with --study), checked; None for a run config."""
    if not req.study:
        if req.array is not None:
            raise UsageError("--array splits a study into array tasks: add --study (the file is a study file)")
        return None
    from ..studies.spec import load_study

    if req.seeds:
        raise UsageError("--seeds makes a seed sweep of a run config; a study sets its seeds itself (study.seeds)")
    if req.overrides:
        raise UsageError("--set changes a run config; change the study file's [base] or axes instead")
    if req.array is not None and (req.array < 1 or (req.scheduler == "pbs" and req.array < 2)):
        raise UsageError(f"--array {req.array}: must be at least {2 if req.scheduler == 'pbs' else 1} "
                         f"(array tasks{', as PBS counts subjobs' if req.scheduler == 'pbs' else ''})")
    return load_study(req.config)


def _check_study(req: JobRequest, study, nranks: int) -> None:
    rpr = study.ranks_per_run
    if nranks < rpr or nranks % rpr:
        raise UsageError(f"{nranks} rank(s) per job for study.ranks_per_run = {rpr}: a job's ranks are split into "
                         f"groups of {rpr}, so make them a multiple of it (--nodes, --ranks-per-node)")
    if req.array and req.array > len(study.runs):
        raise UsageError(f"--array {req.array}: the study has {len(study.runs)} runs, fewer than array tasks")


def _check_texts(req: JobRequest) -> None:
    """What lands in the script as text: each value must stay what it is there (a value in a
    comment or directive cannot be quoted; a newline would start a live line)."""
    for text, option in ((req.workdir, "--workdir"), (req.python, "--python")):
        if text is not None and (_CONTROL.search(text) or not text.strip()):
            raise UsageError(f"{option} {text!r}: must be a non-empty single line, without control characters")
    if req.output is not None and (not req.output or re.search(r"[\s\x00-\x1f\x7f'\"\\`$]", req.output)):
        # A directive is read by the scheduler, not by bash: nothing in it can be quoted.
        raise UsageError(f"--output {req.output!r}: a path without spaces, quotes, $, backslashes or control "
                         "characters (scheduler patterns such as %x-%j.out are fine)")
    if any(_CONTROL.search(line) for line in req.prologue):
        raise UsageError("--prologue: one line each, without control characters (repeat the option for more)")
    for text, option in ((req.config, "CONFIG"), *((o, "--set") for o in req.overrides)):
        if "\x00" in text:
            raise UsageError(f"{option} {text!r}: contains a NUL byte, which no command line can carry")
    try:
        shlex.split(req.launcher_args)
    except ValueError as e:
        raise UsageError(f"--launcher-args {req.launcher_args!r}: {e} (it is split like a shell would)") from None


def _directives(p: Plan) -> list[str]:
    r = p.req
    name = r.job_name or p.name
    array = p.array is not None
    if r.scheduler == "slurm":
        lines = [
            f"--job-name={name}",
            f"--nodes={r.nodes}",
            f"--ntasks-per-node={p.ranks_per_node}",
            f"--cpus-per-task={p.cpus_per_rank}",
            f"--mem={_mem_text(p.mem_mib)}",
        ]
        if r.gpus_per_node:
            lines.append(f"--gpus-per-node={r.gpus_per_node}")
        days, rest = divmod(p.seconds, 86400)
        lines += [
            f"--time={days}-{hms(rest)}" if days else f"--time={hms(rest)}",
            f"--signal=B:USR1@{r.signal_margin}",
            "--requeue",
            *(["--no-kill"] if _relaunches(p) else []),
            "--open-mode=append",
            f"--output={r.output or ('%x-%A_%a.out' if array else '%x-%j.out')}",
        ]
        lines += [f"--{k}={v}" for k, v in (("account", r.account), ("partition", r.partition),
                                              ("qos", r.qos)) if v]
        if array:
            lines.append(f"--array={p.array}")
        return [f"#SBATCH {x}" for x in lines]
    chunk = f"select={r.nodes}:ncpus={p.ranks_per_node * p.cpus_per_rank}:mpiprocs={p.ranks_per_node}"
    chunk += f":ompthreads={p.cpus_per_rank}:mem={_mem_text(p.mem_mib, 'pbs')}"
    if r.gpus_per_node:
        chunk += f":ngpus={r.gpus_per_node}"
    lines = [f"-N {name}", f"-l {chunk}", "-l place=scatter", f"-l walltime={hms(p.seconds)}", "-r y", "-j oe"]
    if r.output:
        lines.append(f"-o {r.output}")
    lines += [f"-{k} {v}" for k, v in (("A", r.account), ("q", r.queue)) if v]
    if array:
        lines.append(f"-J {p.array}")
    return [f"#PBS {x}" for x in lines]


def _environment(p: Plan) -> list[str]:
    r = p.req
    env = [
        "# HDF5's file locks fail on Lustre and NFS; checkpoints publish atomically without them.",
        "export HDF5_USE_FILE_LOCKING=FALSE",
        "export PYTHONUNBUFFERED=1",
        f"# Thread cap: each rank runs on {p.cpus_per_rank} CPU(s); hpcevo sizes XLA's pool itself (NPROC).",
        f"export OMP_NUM_THREADS={p.cpus_per_rank}",
    ]
    if r.gpus_per_node and p.ranks_per_node > 1:
        env += ["# Several ranks per node: no process may grab 75% of a GPU up front.",
                "export XLA_PYTHON_CLIENT_PREALLOCATE=false"]
    if r.scheduler == "slurm":
        env.append("export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-%d}" % p.cpus_per_rank)
    return env


def _relaunches(p: Plan) -> int:
    """How often a Slurm job relaunches on the nodes left after losing some (srun only: the
    relaunch is a new step on part of the allocation)."""
    return p.req.max_relaunches if p.req.scheduler == "slurm" and p.launcher == "srun" else 0


def _relaunch_note(p: Plan) -> str:
    if not _relaunches(p):
        return ""
    return (f"\n# A node lost: the job keeps its allocation (--no-kill); within about a minute the ranks left end\n"
            f"# (hpcevo's watchdog, exit 76) and the run goes on from its newest checkpoint on the nodes that\n"
            f"# still answer, if at least {p.req.min_nodes} (--min-nodes); at most {_relaunches(p)} "
            f"relaunch{'es' if _relaunches(p) > 1 else ''}, then it requeues.")


def _launch(p: Plan) -> list[str]:
    r = p.req
    extra = shlex.split(r.launcher_args)
    if p.launcher == "srun":
        base = [f"--mpi={p.srun_mpi}", '--nodes="$NNODES"', '--ntasks="$NRANKS"',
                f"--ntasks-per-node={p.ranks_per_node}", f"--cpus-per-task={p.cpus_per_rank}", "--cpu-bind=cores",
                "--kill-on-bad-exit=1", '${STEP[@]+"${STEP[@]}"}']
        return ["srun", *base, *map(quote, extra)]
    if p.launcher == "pals":  # Cray PALS (PBS on HPE Cray EX)
        return ["mpiexec", '-n "$NRANKS"', f"--ppn {p.ranks_per_node}", f"--depth {p.cpus_per_rank}",
                "--cpu-bind depth", *map(quote, extra)]
    hosts = ['--machinefile "$PBS_NODEFILE"'] if r.scheduler == "pbs" else []
    return ["mpiexec", '-n "$NRANKS"', *hosts, *map(quote, extra)]


def _array_args(p: Plan) -> list[str]:
    var = '"$SLURM_ARRAY_TASK_ID"' if p.req.scheduler == "slurm" else '"$INDEX"'
    if p.req.study:
        return ["--slice", f"{var}/{p.req.array}"] if p.req.array else []
    args = ["--set", f"run.seed={var}", "--set", f"run.name={quote(p.name + '-seed')}{var}"]
    if p.out:
        args += ["--set", f"run.out={quote(p.out + '-seed')}{var}"]
    return args


def _what(p: Plan) -> str:
    if p.req.study:
        return f"the study below (its runs on groups of ranks) on {p.nranks} ranks"
    return f"the config below on {p.nranks} ranks"


def _array_note(p: Plan) -> str:
    """The header's line on what the array job does (none without an array)."""
    task = "task" if p.req.scheduler == "slurm" else "subjob"
    if p.array is None:
        return ""
    if p.req.study:
        return (f"# An array job: it splits the study, {task} i runs slice i of {p.req.array} (the runs whose\n"
                "# index is i modulo that); `hpcevo study report` reads them all.")
    return f"# An array job, a seed sweep: {task} i runs seed i as run \"{p.name}-seed<i>\"."


def _array_block(p: Plan) -> str:
    """The lines that give an array task its share (none without an array)."""
    if p.array is None:
        return ""
    if p.req.scheduler == "slurm":
        return ("# -- array job: the task's index picks its share --------------------------------------------\n"
                'if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then\n'
                f"  RUN_ARGS+=({' '.join(_array_args(p))})\nfi\n")
    return ("# -- array job: the subjob's index picks its share ------------------------------------------\n"
            'INDEX=${PBS_ARRAY_INDEX:-${HPCEVO_ARRAY_INDEX:-}}\n'
            'if [ -n "$INDEX" ]; then\n'
            f"  RUN_ARGS+=({' '.join(_array_args(p))})\nfi\n")


def _deadline_block(p: Plan) -> str:
    """The run's deadline, from the job's own end time: the time in the queue, the nodes'
    start-up and the prologue's module loads all come out of the limit, not out of the margin."""
    r = p.req
    if r.scheduler == "slurm":
        lines = ["# -- the run's deadline: the job's end time (Slurm's, else its start + --time) less the margin --",
                 f"JOB_END=${{SLURM_JOB_END_TIME:-$((JOB_START + {p.seconds}))}}"]
    else:
        lines = ["# -- the run's deadline: the job's end time (its start + the walltime) less the margin ---------",
                 "# PBS exports no end time; its walltime counts from the job's start, this script's first line.",
                 f"JOB_END=$((JOB_START + {p.seconds}))"]
    lines.append(f"DEADLINE=$((JOB_END - {r.signal_margin}))")
    if p.deadline_at is not None:
        lines.append(f'[ "$DEADLINE" -gt {p.deadline_at} ] && DEADLINE={p.deadline_at}  # --deadline {_comment(r.deadline or "")}')
    lines.append('RUN_ARGS+=(--deadline "@$DEADLINE")')
    return "\n".join(lines) + "\n"


def _chain_note(p: Plan) -> str:
    """PBS: how to submit the job as a chain, where compute nodes may not run qsub."""
    if p.req.scheduler != "pbs" or p.array is not None:
        return ""
    n = p.req.max_requeues
    return ("\n# Where compute nodes may not run qsub, submit it as a chain instead (`hpcevo jobs submit pbs ...\n"
            f"# --resubmit chain` does this): each next job runs only if the one before did not succeed\n# (stopped early, exit 75, or failed) and resumes; once one succeeds PBS deletes the rest:\n"
            f"#   J=$(qsub -v HPCEVO_CHAIN=1 SCRIPT); for i in $(seq {n}); do\n"
            "#     J=$(qsub -W depend=afternotok:$J -v HPCEVO_CHAIN=1,HPCEVO_RESUBMISSIONS=$i SCRIPT); done")


def _signal_note(p: Plan) -> str:
    if p.req.scheduler == "slurm":
        return ("# Slurm signals this shell only (--signal=B:USR1@N before the time limit, scancel -b); the\n"
                "# launcher passes USR1 and TERM on to every rank.")
    return ("# PBS signals this shell only (qdel and the walltime: SIGTERM, then SIGKILL after the\n"
            "# server's kill_delay; qsig -s USR1 by hand); the launcher passes USR1 and TERM on to every rank.")


def _notes(p: Plan) -> str:
    return "\n".join(f"# {_comment(n)}" for n in p.notes)


def render(req: JobRequest) -> str:
    """The job script for ``req``; raises UsageError for an inconsistent request."""
    p = plan(req)
    r = p.req
    run_args = ["study", "run", r.config] if r.study else ["run", r.config]
    for o in r.overrides:
        run_args += ["--set", o]
    # --resume: a requeued job continues, a first one starts fresh. The script adds --deadline
    # (_deadline_block): Slurm's warning signal can come up to a minute late and PBS sends none,
    # so the run also stops by itself.
    run_args += ["--resume"]
    slots = {
        "directives": "\n".join(_directives(p)),
        "command": _comment(r.command or f"hpcevo jobs render {r.scheduler} {shlex.quote(r.config)}"),
        "nranks": str(p.nranks),
        "margin": str(r.signal_margin),
        "max_requeues": str(r.max_requeues),
        "nodes": str(r.nodes),
        "ranks_per_node": str(p.ranks_per_node),
        "min_nodes": str(r.min_nodes),
        "max_relaunches": str(_relaunches(p)),
        "relaunch_note": _relaunch_note(p),
        "name": p.name,
        "workdir": f"cd {quote(r.workdir)} || exit 1" if r.workdir else "",
        "python": quote(r.python),
        "run_args": " ".join(map(quote, run_args)),
        "environment": "\n".join(_environment(p)),
        "prologue": "\n".join(r.prologue) + ("\n" if r.prologue else ""),
        "what": _what(p),
        "array_note": _array_note(p),
        "array_block": _array_block(p),
        # (a subjob continues alone: a plain job, the array directive removed, the index passed)
        "array_resubmit": "" if p.array is None else (
            '    if [ -n "${INDEX:-}" ]; then\n'
            "      # One subjob continues alone: a plain job, the array directive removed, the index passed.\n"
            '      vars="$vars,HPCEVO_ARRAY_INDEX=$INDEX"\n'
            "      after=()\n"
            "    fi\n"),
        "deadline": _deadline_block(p),
        "signal_note": _signal_note(p),
        "chain_note": _chain_note(p),
        "notes": _notes(p),
        "launch": " ".join(_launch(p)),
        "job_script": quote(r.script_path) if r.script_path else '""',
        "launch_and_wait": _fill(_template("launch.sh"), {"signal_note": _signal_note(p)}).rstrip("\n"),
    }
    return _fill(_template(f"{r.scheduler}.sh"), slots)


def quote(value: str) -> str:
    """``value`` as one word of bash, on one line whatever it holds: shell quoting, or for text
    with control characters bash's $'...' form with escapes (a newline inside plain quotes would
    put a line in the script that a scheduler scanning for directives might read)."""
    if not _CONTROL.search(value):
        return shlex.quote(value)
    def escape(ch: str) -> str:
        if ch in "\\'":
            return "\\" + ch
        if _CONTROL.match(ch):
            return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{ord(ch):02x}")
        return ch
    return "$'" + "".join(map(escape, value)) + "'"


def _comment(text: str) -> str:
    """``text`` fit for the rest of a comment line: control characters (a newline would start a
    live line of the script) written as escapes."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def _template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text()


def _fill(template: str, slots: dict[str, str]) -> str:
    used = set(re.findall(r"@([a-z_]+)@", template))
    missing = used - set(slots)
    if missing:  # a template and this module out of step: a bug, not bad input
        raise KeyError(f"template slots without a value: {sorted(missing)}")
    text = re.sub(r"@([a-z_]+)@", lambda m: slots[m[1]], template)
    return re.sub(r"\n{3,}", "\n\n", text)


def submit(req: JobRequest, script: Path) -> str:
    """Render ``req`` to ``script``, submit it with sbatch or qsub, return the job id."""
    req = dataclasses.replace(req, script_path=str(script.resolve()))
    text = render(req)
    p = plan(req)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    script.chmod(0o755)
    if req.output and "/" in req.output and "%" not in req.output.rsplit("/", 1)[0]:
        # Slurm drops the output (and PBS the job's log) when its directory is missing.
        Path(req.output).parent.mkdir(parents=True, exist_ok=True)
    if req.scheduler == "slurm":
        return _call([*["sbatch", "--parsable"], str(script)], p).split(";")[0]
    variables = f"HPCEVO_JOB_SCRIPT={script.resolve()}"
    if req.resubmit != "chain":
        return _call(["qsub", "-v", variables, str(script)], p)
    # A chain: every successor queued now, each waiting for the one before to stop early (exit 75,
    # not 0: PBS deletes the rest once a job succeeds, its dependants never to be satisfied).
    first = job = _call(["qsub", "-v", f"{variables},HPCEVO_CHAIN=1", str(script)], p)
    for i in range(1, req.max_requeues + 1):
        job = _call(["qsub", "-W", f"depend=afternotok:{job}", "-v",
                     f"{variables},HPCEVO_CHAIN=1,HPCEVO_RESUBMISSIONS={i}", str(script)], p)
    return first + (f" (and {req.max_requeues} chained after it, the last {job})" if req.max_requeues else "")


def _call(cmd: list[str], p: Plan) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UsageError(f"{cmd[0]} not found: submit from a {p.req.scheduler} login node, "
                         f"or submit {cmd[-1]} by hand") from None
    if done.returncode != 0:
        raise UsageError(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()
