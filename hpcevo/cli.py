"""Command line: parse, call the library, map errors to exit codes. No logic a library user needs.

Exit codes: 0 success; 2 bad input (config, argument, run directory), reported once by rank 0 and
returned by every rank; 3 replicas diverged; 1 an unexpected error, whose traceback is printed
prefixed with its rank before MPI_Abort ends the whole job.
"""

from __future__ import annotations

import argparse
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
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override a config key, value typed as TOML (repeatable)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in the run directory")
    run.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    sub.add_parser("info", help="what this job sees: MPI, ranks, hosts, devices, HDF5, versions")
    return p


def _run(ctx, args) -> int:
    from .config import load_config
    from .parallel import agree_on_error, bind
    from .runner import execute

    error = None
    try:
        cfg = load_config(args.config, args.overrides)
        bind(ctx, cfg.parallel.device, cfg.parallel.threads_per_rank)
    except UsageError as e:
        error = e
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    execute(ctx, cfg, overwrite=args.overwrite, quiet=args.quiet)
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
    from .errors import DivergenceError
    from .parallel import discover

    ctx = discover()
    _Parser.root = ctx.is_root
    try:
        args = build_parser().parse_args(argv)
        return {"run": _run, "info": _info}[args.command](ctx, args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (UsageError, DivergenceError) as e:
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
