"""Command line: parse, call the library, map errors to exit codes. No logic a library user needs.

Exit codes (hpcevo/errors.py): 0 success; 2 bad input (config, argument, run directory,
checkpoint), reported once by rank 0 and returned by every rank; 3 replicas diverged; 4 a
checkpoint could not be written; 75 stopped early by a signal or deadline after writing a
checkpoint (requeue with --resume); 1 an unexpected error, whose traceback is printed prefixed
with its rank before MPI_Abort ends the whole job.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting and speaks only on rank 0."""

    root = True

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")

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
    sub.add_parser("info", help="what this job sees: MPI, ranks, hosts, devices, HDF5, versions")
    inspect = sub.add_parser("inspect", help="what is in a run directory or checkpoint file, and whether it validates")
    inspect.add_argument("path", help="run directory, checkpoint directory or checkpoint file (.h5)")
    plot = sub.add_parser("plot", help="convergence picture of a run (PNG)")
    plot.add_argument("run_dir", help="run directory (or a checkpoint file)")
    plot.add_argument("-o", "--output", help="PNG to write (default RUN_DIR/convergence.png)")
    return p


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


def _run(ctx, args) -> int:
    from .config import load_config
    from .errors import EXIT_STOPPED
    from .parallel import agree_on_error, bind
    from .runner import execute, run_config_path

    error = None
    try:
        overrides = args.overrides
        if args.command == "resume":
            path = run_config_path(args.run_dir)
            # The run stays where it is, wherever it is resumed from.
            overrides = [f"run.out={json.dumps(str(args.run_dir))}", *overrides]
        else:
            path = args.config
        cfg = load_config(path, overrides)
        bind(ctx, cfg.parallel.device, cfg.parallel.threads_per_rank)
    except UsageError as e:
        error = e
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    summary = execute(ctx, cfg, overwrite=getattr(args, "overwrite", False), resume=args.resume,
                      quiet=args.quiet, deadline=args.deadline)
    return EXIT_STOPPED if summary["status"] == "stopped" else 0


def _inspect(ctx, args) -> int:
    from .inspection import inspect_path

    if ctx.is_root:  # one process reads; under a launcher the other ranks just wait
        print(inspect_path(args.path))
    return 0


def _plot(ctx, args) -> int:
    from .inspection import plot_run

    if ctx.is_root:
        print(f"wrote {plot_run(args.run_dir, args.output)}")
    return 0


def _info(ctx, args) -> int:
    from .info import describe, render
    from .parallel import bind

    bind(ctx)
    text = render(describe(ctx))
    if ctx.is_root:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    from .errors import CheckpointError, DivergenceError
    from .parallel import discover

    ctx = discover()
    _Parser.root = ctx.is_root
    try:
        args = build_parser().parse_args(argv)
        handler = {"run": _run, "resume": _run, "info": _info, "inspect": _inspect, "plot": _plot}
        return handler[args.command](ctx, args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (UsageError, DivergenceError, CheckpointError) as e:
        if ctx.is_root:
            print(f"hpcevo: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except BaseException:
        prefix = f"[rank {ctx.rank}] "
        text = traceback.format_exc()
        sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        ctx.abort(1)
        return 1
