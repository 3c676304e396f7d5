"""Command line: parse, call the library, map errors to exit codes. No logic a library user needs.

Exit codes (hpcevo/errors.py): 0 success; 2 bad input (config, argument, run directory,
checkpoint), reported once by rank 0 and returned by every rank; 3 replicas diverged; 4 a
checkpoint could not be written; 75 stopped early by a signal or deadline after writing a
checkpoint (requeue with --resume); 1 an unexpected error, whose traceback is printed prefixed
with its rank before MPI_Abort ends the whole job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback

from .errors import UsageError
from .launcher import launcher_rank, launcher_size


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting and speaks only on rank 0."""

    root = True

    def error(self, message: str):  # type: ignore[override]
        # main prints "hpcevo: error: ..."; the sub-command names where ("run: ...").
        where = self.prog.removeprefix("hpcevo").strip()
        raise UsageError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")

    def _print_message(self, message, file=None):
        if self.root:
            super()._print_message(message, file)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hpcevo", description="MPI-first evolutionary computation with JAX.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a config (under mpirun/srun, or as one rank without a launcher)")
    run.add_argument("config", help="run config, TOML")
    _run_options(run, resume=False)
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in the run directory")
    resume = sub.add_parser("resume", help="continue the run in RUN_DIR from its newest valid checkpoint")
    resume.add_argument("run_dir", help="a run directory (holds config.toml)")
    _run_options(resume, resume=True)
    info = sub.add_parser("info", help="what this job sees: MPI, ranks, hosts, binding, HDF5, versions")
    info.add_argument("config", nargs="?", help="bind as this run config's [parallel] section asks")
    info.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                      help="override a config key (repeatable)")
    inspect = sub.add_parser("inspect", help="what is in a run directory or checkpoint file, and whether "
                             "it validates (exit 1: the file, or the directory's newest checkpoint, is damaged)")
    inspect.add_argument("path", help="run directory, checkpoint directory or checkpoint file (.h5)")
    plot = sub.add_parser("plot", help="convergence picture of a run, or of several runs compared (PNG)")
    plot.add_argument("run_dir", nargs="+", help="run directory (or a checkpoint file); several: a comparison "
                      "(median and quartiles of the runs that differ only in seed)")
    plot.add_argument("-o", "--output", help="PNG to write (default RUN_DIR/convergence.png; several runs: "
                      "comparison.png beside the first)")
    _jobs_parser(sub)
    _study_parser(sub)
    model = sub.add_parser("model", help="project step time and parallel efficiency to many ranks (no MPI needed)")
    model.add_argument("--pop", type=int, required=True, help="candidates evaluated per generation")
    model.add_argument("--eval-ms", type=float, required=True, help="milliseconds to evaluate one candidate")
    model.add_argument("--algo-ms", type=float, default=0.0, help="ask + tell per generation, ms (measured at 1 rank)")
    model.add_argument("--microbatch", type=int, default=0, help="parallel.microbatch (0: automatic)")
    model.add_argument("--network", default="ib-hdr", help="ib-hdr (default) | ib-edr | eth-25g")
    model.add_argument("--alpha-us", type=float, help="MPI latency per message, us (overrides --network)")
    model.add_argument("--bandwidth-gbs", type=float, help="bandwidth, GB/s (overrides --network)")
    model.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 16, 64, 256, 1024, 4096])
    model.add_argument("--float64", action="store_true", help="fitness values of 8 bytes")
    model.add_argument("--plot", metavar="PNG", help="also draw the projection")
    return p


def _jobs_parser(sub) -> None:
    jobs = sub.add_parser("jobs", help="batch job scripts for Slurm and PBS Pro (no MPI needed)")
    verbs = jobs.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("scheduler", choices=("slurm", "pbs"))
    common.add_argument("config", help="run config, TOML")
    g = common.add_argument_group("resources")
    g.add_argument("--nodes", type=int, default=1)
    g.add_argument("--gpus-per-node", type=int, default=0, help="0 (default): CPU nodes")
    g.add_argument("--ranks-per-node", type=int, help="default: one per GPU, or 1 on CPU nodes")
    g.add_argument("--cpus-per-rank", type=int,
                   help="CPU cores per rank (a CPU rank's thread count; a GPU rank's default: the node's cores "
                        "shared by its ranks)")
    g.add_argument("--cpus-per-node", type=int,
                   help="the nodes' cores (default: asked of sinfo / pbsnodes; a CPU job fills them with ranks)")
    g.add_argument("--mem", help="memory per node, e.g. 64G (default: 4G per CPU asked for, at most a node's)")
    g.add_argument("--ranks", type=int, help="total ranks, checked against nodes x ranks per node")
    g.add_argument("--time", required=True, help="time limit: [D-]HH:MM:SS, HH:MM, 90m, 2h")
    g.add_argument("--signal-margin", type=int, default=300, metavar="SECONDS",
                   help="warning signal (Slurm) / deadline (PBS) this long before the limit")
    g.add_argument("--account")
    g.add_argument("--partition", help="Slurm")
    g.add_argument("--qos", help="Slurm")
    g.add_argument("--queue", help="PBS")
    g = common.add_argument_group("job")
    g.add_argument("--launcher", help="slurm: srun (default) | mpiexec; pbs: mpiexec (default) | pals")
    g.add_argument("--srun-mpi", help="srun --mpi plugin: pmi2 | pmix (default: from the MPI the job's "
                                       "mpi4py runs: pmix for Open MPI, else pmi2)")
    g.add_argument("--deadline", metavar="WHEN", help="a time the run must also stop before (2026-11-28T06:00, "
                                                      "@EPOCH), e.g. a maintenance window")
    g.add_argument("--launcher-args", default="", help="extra launcher arguments, one string")
    g.add_argument("--seeds", help="job array for a seed sweep: FIRST-LAST[:STEP]; index = seed")
    g.add_argument("--study", action="store_true", help="CONFIG is a study file: the job runs the study")
    g.add_argument("--array", type=int, metavar="K", help="with --study: K array tasks, task i runs slice i of K")
    g.add_argument("--output", help="job log path (scheduler patterns allowed)")
    g.add_argument("--job-name", help="default: run.name")
    g.add_argument("--python", help="interpreter in the job (default: this one)")
    g.add_argument("--workdir", help="directory the job runs in (default: where it is submitted)")
    g.add_argument("--max-requeues", type=int, default=10)
    g.add_argument("--resubmit", default="self", choices=("self", "chain"),
                   help="PBS: self (the job qsubs its successor) or chain (submit queues them all up front, "
                        "for sites without qsub on compute nodes)")
    g.add_argument("--min-nodes", type=int, default=1,
                   help="Slurm: after losing nodes, go on with the rest if at least this many are left (default 1)")
    g.add_argument("--max-relaunches", type=int, default=3,
                   help="Slurm: relaunches on the nodes left within one allocation (default 3; 0: requeue instead)")
    g.add_argument("--prologue", action="append", default=[], metavar="LINE",
                   help="site set-up line, e.g. 'module load cuda' (repeatable)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config key in the job's run (repeatable)")
    render = verbs.add_parser("render", parents=[common], help="write a ready-to-submit job script")
    render.add_argument("-o", dest="out", help="write to this file (default: stdout)")
    submit = verbs.add_parser("submit", parents=[common], help="render, then sbatch/qsub; print the job id")
    submit.add_argument("-o", dest="out", help="script file (default: <job name>.sbatch or .pbs here)")


STUDY_VERBS = ("run", "plan", "status", "report")


def _study_parser(sub) -> None:
    study = sub.add_parser("study", help="many runs in one job: seeds x algorithms x problems x settings "
                           "(hpcevo study FILE runs it; plan, status, report)")
    verbs = study.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    run = verbs.add_parser("run", help="run the study's runs on groups of ranks (collective; the default verb)")
    run.add_argument("study", help="study file, TOML")
    run.add_argument("--resume", action="store_true", help="continue: skip done runs, resume interrupted ones")
    run.add_argument("--overwrite", action="store_true", help="start the study again from nothing")
    run.add_argument("--retry-failed", action="store_true", help="with --resume: run failed runs again")
    run.add_argument("--rerun-changed", action="store_true", help="with --resume: start again the begun runs whose "
                     "settings the study file now changes (without it, such a resume is refused)")
    run.add_argument("--slice", metavar="I/K", help="run only slice I of K (runs whose index is I modulo K)")
    run.add_argument("--deadline", metavar="WHEN", help="checkpoint every run and exit 75 before this (as hpcevo run)")
    run.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    plan = verbs.add_parser("plan", help="list the runs a study file expands into, checked (no MPI)")
    plan.add_argument("--json", action="store_true", help="one JSON record per run")
    status = verbs.add_parser("status", help="done, failed, stopped, running and pending runs (no MPI)")
    report = verbs.add_parser("report", help="statistics, tables and figures of a study's runs (no MPI)")
    for p in (plan, status, report):
        p.add_argument("study", help="study file, TOML")
    for p in (run, plan, status, report):
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override a key of the study file, e.g. study.seeds=3, base.run.generations=50")
    report.add_argument("-o", "--output", help="directory to write (default: <study out>/report)")
    report.add_argument("--baseline", help="configuration the others are compared with (default: study.baseline, "
                        "else the first)")
    report.add_argument("--target", type=float, help="success threshold for every problem (default: the study's)")


def _run_options(p: argparse.ArgumentParser, resume: bool) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config key, value typed as TOML, e.g. run.generations=5000 (repeatable)")
    if resume:
        p.set_defaults(resume=True)
    else:
        p.add_argument("--resume", action="store_true",
                       help="continue from the newest valid checkpoint (start afresh if there is none)")
    p.add_argument("--deadline", metavar="WHEN",
                   help="checkpoint and exit 75 before this: seconds, a duration (90m, 01:30:00) or a "
                        "local time (2026-11-23T18:00); the scheduler's end time is used when known")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")


def _load_and_bind(ctx, source):
    """Read the config that ``source()`` names (path, overrides; no path: defaults) and bind
    this rank as its [parallel] section asks. Every rank takes the same exit when that fails on
    some of them (a missing file on one node, a node with fewer GPUs)."""
    from .api import load_config
    from .config import ParallelSection
    from .driver import startup
    from .parallel import collective_stage, init

    cfg = None
    with collective_stage(ctx, catch=UsageError):
        path, overrides = source()
        cfg = load_config(path, overrides) if path else None
        guard = _startup_guard()
        if cfg is not None and guard.armed:  # (here, before the ranks agree on it: that waits for all)
            if cfg.fault.watchdog:
                guard.arm(cfg.fault.startup_seconds, "fault.startup_seconds", keep_start=True)
            else:
                guard.end()
    par = cfg.parallel if cfg else ParallelSection()
    init(par.device, par.threads_per_rank, par.share_gpus)
    startup.mark("config")
    return cfg


def _run(ctx, args) -> int:
    from pathlib import Path

    from .api import run
    from .driver.rundir import run_config_path, speaking
    from .errors import EXIT_STOPPED

    def source():
        if args.command == "resume":
            if Path(args.run_dir).is_file():
                raise UsageError(f"resume takes a run directory, and '{args.run_dir}' is a file; to continue "
                                 f"the run of a config: hpcevo run {args.run_dir} --resume")
            # The run stays where it is, wherever it is resumed from.
            return run_config_path(args.run_dir), [f"run.out={json.dumps(str(args.run_dir))}", *args.overrides]
        return args.config, args.overrides

    cfg = _load_and_bind(ctx, source)
    with speaking("cli"):  # the library's messages name --resume, --overwrite (not resume=True)
        result = run(cfg, ctx=ctx, overwrite=getattr(args, "overwrite", False), resume=args.resume,
                     quiet=args.quiet, deadline=args.deadline)
    return EXIT_STOPPED if result.status == "stopped" else 0


def _study(ctx, args) -> int:
    from .studies import tools

    if args.verb != "run":
        return tools.main(args)  # (offline: one process reads the files)
    from .api import study
    from .driver.rundir import speaking

    with speaking("cli"):
        result = study(args.study, resume=args.resume, overwrite=args.overwrite, retry_failed=args.retry_failed,
                       quiet=args.quiet, deadline=args.deadline, part=tools.parse_slice(args.slice),
                       overrides=args.overrides, rerun_changed=args.rerun_changed)
    return result.exit_code


def _model(ctx, args) -> int:
    from .tools import model

    net, label = model.network(args.network, args.alpha_us, args.bandwidth_gbs)
    w = model.workload(args.pop, args.eval_ms, args.algo_ms, args.microbatch, args.float64)
    if any(p < 1 for p in args.ranks):
        raise UsageError("--ranks: every rank count must be >= 1")
    print(model.render(w, model.project(w, args.ranks, net), net, label))
    if args.plot:
        model.plot(w, model.project(w, sorted({*args.ranks, *(2 ** i for i in range(13))}), net), args.plot)
        print(f"wrote {args.plot}")
    return 0


def _inspect(ctx, args) -> int:
    from .tools.inspection import inspect

    if ctx.is_root:  # one process reads; under a launcher the other ranks just wait
        text, damaged = inspect(args.path)
        print(text)
        return 1 if damaged else 0  # scripts can test a checkpoint before they resume from it
    return 0


def _plot(ctx, args) -> int:
    from .tools.plotting import plot

    if ctx.is_root:
        print(f"wrote {plot(args.run_dir, args.output)}")
    return 0


def _info(ctx, args) -> int:
    from .parallel.info import describe, render

    def source():
        if args.overrides and not args.config:
            raise UsageError("info: --set needs a config to override (hpcevo info CONFIG --set KEY=VALUE)")
        return args.config, args.overrides

    _load_and_bind(ctx, source)
    text = render(describe(ctx))
    if ctx.is_root:
        print(text)
    return 0


def _jobs(ctx, args) -> int:
    from pathlib import Path

    from .jobs import render, submit

    req = _job_request(args)
    if args.verb == "render":
        if args.out:
            req = dataclasses.replace(req, script_path=args.out)
        text = render(req)
        if args.out:
            _write_script(Path(args.out), text)
        else:
            sys.stdout.write(text)
        return 0
    suffix = ".sbatch" if req.scheduler == "slurm" else ".pbs"
    script = Path(args.out or f"{req.job_name or Path(req.config).stem}{suffix}")
    print(submit(req, script))
    return 0


def _write_script(path, text: str) -> None:
    if not path.parent.is_dir():
        raise UsageError(f"-o {path}: directory '{path.parent}' does not exist")
    try:
        path.write_text(text)
    except OSError as e:
        raise UsageError(f"-o {path}: cannot write: {e.strerror}") from None


def _job_request(args):
    """The JobRequest of parsed `hpcevo jobs render|submit` arguments."""
    import shlex

    from .jobs import JobRequest

    fields = {f.name for f in dataclasses.fields(JobRequest)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    given["overrides"] = tuple(args.overrides)
    given["prologue"] = tuple(args.prologue)
    given["command"] = " ".join(shlex.quote(c) for c in ["hpcevo", *args.argv])
    return JobRequest(**given)


def main(argv: list[str] | None = None) -> int:
    argv_list = sys.argv[1:] if argv is None else list(argv)
    # Job scripts are written and models run on login nodes, where MPI_Init may not work.
    if argv_list[:1] == ["study"] and len(argv_list) > 1 and argv_list[1] not in (*STUDY_VERBS, "-h", "--help"):
        argv_list.insert(1, "run")  # hpcevo study FILE: the study is run
    # (plan, status and report read files: no MPI, as on a login node)
    offline = argv_list[:1] in (["jobs"], ["model"]) or (argv_list[:1] == ["study"] and argv_list[1:2] in (
        ["plan"], ["status"], ["report"]))
    if offline and launcher_rank() > 0:
        return 0  # started by a launcher anyway: rank 0 alone writes, submits and speaks
    ctx = None if offline else _discover(argv_list)
    try:
        code = _main(ctx, argv_list)
    except BrokenPipeError:
        if not offline:
            raise
        # (`hpcevo study plan ... | head`: the reader left; what it read stands. stdout to
        # /dev/null, or Python's flush at exit says it again)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    finally:
        _startup_guard().end()
    if ctx is not None:
        from .parallel.control import skip_end_agreement

        skip_end_agreement()  # (every rank takes the exit agreed on: no collective call at the end)
    _record_exit(ctx, code)
    return code


def _record_exit(ctx, code: int) -> None:
    """Write this run's exit code where a job script asked for it (HPCEVO_EXIT_FILE, rank 0):
    MPICH's mpiexec can report 0 after forwarding a signal although the ranks exited 75, and
    the job script would then not requeue (hpcevo/jobs/templates/launch.sh)."""
    path = os.environ.get("HPCEVO_EXIT_FILE")
    if not path or not (ctx is None or ctx.is_root):
        return
    try:
        with open(path, "w") as f:
            f.write(f"{code}\n")
    except OSError:
        pass  # the launcher's own code still stands


def _main(ctx, argv_list: list[str]) -> int:
    from .errors import CheckpointError, DivergenceError

    _Parser.root = ctx is None or ctx.is_root
    try:
        args = build_parser().parse_args(argv_list)
        args.argv = argv_list
        handler = {"run": _run, "resume": _run, "info": _info, "inspect": _inspect, "plot": _plot, "jobs": _jobs,
                   "model": _model, "study": _study}
        return handler[args.command](ctx, args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (UsageError, DivergenceError, CheckpointError) as e:
        if getattr(e, "stranded", False) and ctx is not None and ctx.size > 1:
            # The other ranks are stuck in a collective this rank left (HDF5's, on a full disk)
            # and cannot hear an error any more: this rank reports and ends the job for all.
            print(f"hpcevo: error: {e} [rank {ctx.rank} ended the job: the other ranks did not come "
                  "back from HDF5's collective call]", file=sys.stderr, flush=True)
            ctx.abort(e.exit_code)
        if ctx is None or ctx.is_root:
            print(f"hpcevo: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except BaseException:
        if ctx is None:
            raise
        prefix = f"[rank {ctx.rank}] "
        text = traceback.format_exc()
        sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        ctx.abort(1)
        return 1


def _startup_guard():
    from .parallel.watchdog import STARTUP_GUARD

    return STARTUP_GUARD


def _discover(argv_list: list[str]):
    from .driver import startup
    from .parallel import discover

    # Start-up is watched from here, MPI_Init, until the run's watchdog opens (every rank there):
    # a rank stopped or lost before that would leave the others in their first collective call.
    if launcher_size() > 1:
        limit, why = _early_startup_limit(argv_list)
        _startup_guard().arm(limit, why)
    ctx = discover()
    if ctx.size == 1:
        _startup_guard().end()
    startup.mark("imports_mpi")
    return ctx


def _early_startup_limit(argv_list: list[str]) -> tuple[float, str]:
    """``fault.startup_seconds`` as the config of ``run``/``resume`` sets it, before MPI starts;
    else the default."""
    from pathlib import Path

    from .config import FaultSection, peek_startup_seconds

    words = list(argv_list)
    sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
    sets += [w.split("=", 1)[1] for w in words if w.startswith("--set=")]
    positional = [w for i, w in enumerate(words) if not w.startswith("-") and (i == 0 or words[i - 1] != "--set")]
    path = None
    if positional[:1] == ["run"] and len(positional) > 1:
        path = Path(positional[1])
    elif positional[:1] == ["resume"] and len(positional) > 1:
        path = Path(positional[1]) / "config.toml"
    value = None if path is None else peek_startup_seconds(path, sets)
    if value is None:
        return FaultSection().startup_seconds, "fault.startup_seconds, its default"
    return value, "fault.startup_seconds"
