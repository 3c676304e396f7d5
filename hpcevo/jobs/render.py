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
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Literal

from ..errors import UsageError

SCHEDULERS = ("slurm", "pbs")
LAUNCHERS = {"slurm": ("srun", "mpiexec"), "pbs": ("mpiexec", "pals")}
SRUN_MPI = ("pmi2", "pmix")


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
    signal_margin: int = 300  # seconds before the limit: Slurm's warning signal / PBS deadline
    account: str | None = None
    partition: str | None = None  # Slurm
    qos: str | None = None  # Slurm
    queue: str | None = None  # PBS
    launcher: str | None = None  # slurm: srun | mpiexec; pbs: mpiexec | pals
    srun_mpi: str = "pmi2"
    launcher_args: str = ""
    seeds: str | None = None  # array spec: 0-9, 0-9:2 (Slurm also 1,5,7)
    study: bool = False  # config is a study file: the job runs `hpcevo study run` on it
    array: int | None = None  # a study as this many array tasks, each running its slice of the runs
    output: str | None = None  # log file
    job_name: str | None = None
    python: str = sys.executable
    overrides: tuple[str, ...] = ()
    max_requeues: int = 10
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
    gpus = req.gpus_per_node
    if gpus and cfg.parallel.device == "cpu":
        raise UsageError(f"--gpus-per-node {gpus}, but {req.config} sets parallel.device = 'cpu'")
    for value, option in ((req.ranks_per_node, "--ranks-per-node"), (req.cpus_per_rank, "--cpus-per-rank"),
                          (req.ranks, "--ranks")):
        if value is not None and value < 1:  # (0 must not fall back to a default: say so)
            raise UsageError(f"{option} {value}: must be at least 1")
    rpn = req.ranks_per_node if req.ranks_per_node is not None else gpus or 1
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
    threads = cfg.parallel.threads_per_rank
    cpus = req.cpus_per_rank if req.cpus_per_rank is not None else (threads if isinstance(threads, int) else 1)
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
    if req.srun_mpi not in SRUN_MPI:
        raise UsageError(f"--srun-mpi {req.srun_mpi!r}: allowed: {', '.join(SRUN_MPI)}")
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
        return Plan(req, study.name, str(study.out), rpn, cpus, seconds, launcher, None, array)
    return Plan(req, cfg.run.name, cfg.run.out, rpn, cpus, seconds, launcher, seeds, req.seeds)


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
    chunk += f":ompthreads={p.cpus_per_rank}"
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
        base = [f"--mpi={r.srun_mpi}", '--nodes="$NNODES"', '--ntasks="$NRANKS"',
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
    """The header's line on what an array job does (none for a study run whole)."""
    task = "task" if p.req.scheduler == "slurm" else "subjob"
    if p.req.study:
        return (f"# An array job splits the study: {task} i runs slice i of {p.req.array} (the runs whose index\n"
                "# is i modulo that); `hpcevo study report` reads them all." if p.req.array else "")
    return f"# An array job is a seed sweep: {task} i runs seed i as run \"{p.name}-seed<i>\"."


def render(req: JobRequest) -> str:
    """The job script for ``req``; raises UsageError for an inconsistent request."""
    p = plan(req)
    r = p.req
    run_args = ["study", "run", r.config] if r.study else ["run", r.config]
    for o in r.overrides:
        run_args += ["--set", o]
    # --resume: a requeued job continues, a first one starts fresh. --deadline: Slurm's warning
    # signal can come up to a minute late and PBS sends none, so the run also stops by itself.
    run_args += ["--resume", "--deadline", str(p.seconds - r.signal_margin)]
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
        "array_args": " ".join(_array_args(p)),
        "what": _what(p),
        "array_note": _array_note(p),
        "launch": " ".join(_launch(p)),
        "job_script": quote(r.script_path) if r.script_path else '""',
        "launch_and_wait": _template("launch.sh").rstrip("\n"),
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
        cmd = ["sbatch", "--parsable", str(script)]
    else:
        cmd = ["qsub", "-v", f"HPCEVO_JOB_SCRIPT={script.resolve()}", str(script)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UsageError(f"{cmd[0]} not found: submit from a {p.req.scheduler} login node, "
                         f"or submit {script} by hand") from None
    if done.returncode != 0:
        raise UsageError(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()}")
    out = done.stdout.strip()
    return out.split(";")[0] if req.scheduler == "slurm" else out
