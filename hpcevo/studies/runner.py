"""Running a study: the job split into groups of ``ranks_per_run`` ranks that take runs from a
queue until none is left. Collective over the job.

Each run is an ordinary run (``driver.execute``) on its group's context, so its directory, its
digest and its resume are those of the same config run alone at that many ranks. A group keeps
what it built for one run for the next run of the same program (``RunOptions.reuse``, and the
engine's programs: ``driver.loop.device_engine``). Runs are handed out longest first (their
evaluations, the budget where it is smaller, x dimension), and among runs of one length program
by program in turn (``spread_programs``): the groups compile different programs side by side,
and a program's later runs load it from the compilation cache. A group that finishes early takes
the next run: runs of different lengths balance themselves.

A stop signal (SIGTERM, SIGUSR1, SIGINT) or the deadline stops every group's run at its next
boundary with a checkpoint, no run is started after, and the study ends "stopped" (exit 75):
``--resume`` continues it at any rank count and any ``ranks_per_run``. A run that fails on its
own (its problem raises, a config that cannot run) is recorded as failed with its message and
the others go on; one that cannot write its checkpoint stops the study (the disk is likely full
for all of them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import EXIT_RUNS_FAILED, EXIT_STOPPED, CheckpointError, UsageError
from ..parallel import (ParallelContext, WorkQueue, agree_max, bcast_from_root, collective_stage, split)
from ..parallel.watchdog import Watchdog
from ..driver import rundir
from ..driver.execute import RunOptions
from ..driver.run_batch import RunBatch
from ..driver.stopping import StopFlag, StopSource, find_deadline, signal_name
from .journal import Journal, journal_files, journal_path, read_events, states
from .spec import Study, StudyRun, batch_size


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """How a study is launched. ``resume``: continue (skip done runs, resume interrupted ones,
    start the rest); ``overwrite``: start again from nothing; ``retry_failed`` (with resume):
    run the failed ones again too; ``part``: (i, k), run only slice i of k (runs whose index is
    i modulo k: an array task's share); ``deadline``, ``stop``, ``quiet``, ``stream``, ``face``:
    as for a run (``RunOptions``); ``rerun_changed`` (with resume): begun runs whose config the
    study file now changes start again from generation 1 (without it such a resume is refused)."""

    resume: bool = False
    overwrite: bool = False
    retry_failed: bool = False
    quiet: bool = False
    deadline: str | int | float | None = None
    stop: StopSource | None = None
    stream: TextIO | None = None
    part: tuple[int, int] | None = None
    face: str = "api"
    rerun_changed: bool = False


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """What a launch of a study did, the same on every rank."""

    status: str  # "complete" (every run done), "failed" (some failed), "stopped" (some not run yet)
    counts: dict[str, int]  # runs of this launch's share by state (journal.STATES)
    ran: list[dict[str, Any]]  # this launch's "end" records: run, status, digest, best, seconds, error
    wall_s: float
    idle: float  # share of the job's rank-time that no run used (leftover ranks, the tail)
    out: Path
    exit_code: int  # 0, EXIT_RUNS_FAILED, EXIT_STOPPED, or CheckpointError's

    def digests(self) -> dict[str, str]:
        return {r["run"]: r["state_digest"] for r in self.ran if r.get("state_digest")}


def run_study(world: ParallelContext, study: Study, options: StudyOptions = StudyOptions()) -> StudyResult:
    """Run ``study`` (its share ``options.part``) on every rank of ``world``. Collective."""
    with rundir.speaking(options.face):
        return _Launch(world, study, options).run()


class _Launch:
    def __init__(self, world: ParallelContext, study: Study, options: StudyOptions):
        self.world, self.study, self.options = world, study, options
        k = options.part
        self.mine = [r for r in study.runs if k is None or r.index % k[1] == k[0]]
        self.journal: Journal | None = None
        self.busy = 0.0
        self.started: dict[int, float] = {}  # group -> when its runs in flight began
        self.in_flight: dict[int, int] = {}  # group -> its runs in flight
        self.ended: list[dict[str, Any]] = []
        self.todo_count = 0
        self.fatal: int | None = None
        self.dog: Watchdog | None = None
        self.fault = None

    # -- the launch, collectively ----------------------------------------------------------------
    def run(self) -> StudyResult:
        world, study, options = self.world, self.study, self.options
        if study.ranks_per_run > world.size:
            raise UsageError(f"{study.name}: study.ranks_per_run = {study.ranks_per_run}, but the job has "
                             f"{world.size} rank{'s' if world.size != 1 else ''}: start at least "
                             f"{study.ranks_per_run} (or lower ranks_per_run)")
        todo: list[int] = []
        self.rerun: set[str] = set()
        lock = rundir.DirLock(None)
        try:
            with collective_stage(world):
                if world.is_root:
                    # one launch per study directory (per share: --part k/n launches run side by side)
                    part = self.options.part
                    lock = rundir.DirLock.take(study.out, f"study directory '{study.out}'" + (
                        f" (share {part[0]}/{part[1]})" if part else ""),
                        rundir.LOCK if part is None else f"{rundir.LOCK}-{part[0]}of{part[1]}")
                    todo = self._prepare()
            todo, rerun = bcast_from_root(world, (todo, sorted(self.rerun)))
            self.rerun = set(rerun)
            return self._launch(todo)
        finally:
            lock.release()

    def _launch(self, todo: list[int]) -> StudyResult:
        world, study, options = self.world, self.study, self.options
        groups = split(world, study.ranks_per_run)
        t0 = time.time()
        if world.is_root and not options.quiet:
            self._say(self._banner(len(todo), groups))
        deadline = find_deadline(world, options.deadline, None, _margin(study), t0)
        # (a group goes on with the runs of a program it has loaded: each program is loaded, or
        # compiled, by as few groups as the balance allows)
        kinds = {i: (self.study.runs[i].cost(), self.study.runs[i].program) for i in todo} if world.is_root else None
        queue = WorkQueue(groups, todo, self._event if world.is_root else None, kinds)
        flag = options.stop if options.stop is not None else StopFlag()
        fault = study.runs[0].config().fault if study.runs else None
        # The job's watchdog (each run has its own, on its group): a host lost while groups wait
        # for rank 0's queue or for each other ends the job (exit 76), to be relaunched and resumed.
        with Watchdog.start(world, heartbeat_seconds=fault.heartbeat_seconds if fault else 2.0,
                            enabled=bool(fault and fault.watchdog)) as self.dog:
            self.fault = fault
            with flag:
                if groups.ctx is not None:
                    self._take_runs(groups.ctx, queue, flag, deadline)
            self._waiting("waiting for the other groups' runs")
            left = queue.close()
            return self._finish(t0, groups, left)

    def _waiting(self, what: str) -> None:
        """The job's watchdog armed while this rank waits for others' work, of any length."""
        if self.dog is not None and self.fault is not None:
            # One rank silent for longer than a checkpoint may take (the longest call that holds
            # the GIL, stopping its heartbeats) is stopped or hung: with groups of one rank no
            # other rank runs beside it to notice, and the groups would wait for it forever.
            self.dog.arm_open(f"the study, {what}", self.fault.min_seconds, "fault.min_seconds",
                              rank_silence=max(self.fault.min_seconds, self.fault.checkpoint_seconds),
                              rank_why="fault.checkpoint_seconds, the longest a rank may be silent in a checkpoint")

    def _take_runs(self, ctx: ParallelContext, queue: WorkQueue, flag: StopSource, deadline) -> None:
        """This group's runs: taken from the queue a batch of one program at a time (``RunBatch``),
        a finished run's slot given to the next pending run of that program (``study.batch = 1``:
        one run at a time)."""
        size = batch_size(self.study.batch)
        outcomes: list[dict[str, Any]] = []
        reuse: dict = {}
        batch: RunBatch | None = None
        kind, more, halted = None, True, None
        try:
            while True:
                self._waiting("taking the next run")
                signum, late = agree_max(ctx, [flag.signum, deadline.due()])
                halt = signal_name(int(signum)) if signum else "the deadline" if late else None
                # (a stop, a deadline, a checkpoint that could not be written: no run is started after)
                halted = halted or halt or next((o["halt"] for o in outcomes if o.get("halt")), None)
                halt = halted
                busy = len(batch) if batch is not None else 0
                if not busy:
                    want, of = (0 if halt else 1), None
                elif more and batch is not None and batch.batchable and not halt:
                    want, of = batch.capacity(size) - busy, kind
                else:
                    want, of = 0, None
                tasks = []
                if outcomes or want > 0 or not busy:
                    tasks = queue.take(outcomes, halt, max(want, 0), of, busy)
                    outcomes = []
                    if of is not None and len(tasks) < want:
                        more = False  # (the queue holds no more runs of this program)
                self.dog.disarm()
                if not tasks and not busy:
                    return
                for task in tasks:
                    run = self.study.runs[task]
                    if batch is None or not len(batch):
                        if batch is not None:
                            batch.close()
                        batch, kind, more = RunBatch(ctx), run.program, size > 1
                    remaining = None if deadline.at is None else max(1.0, deadline.at - time.time())
                    for ended in batch.add(run.config(), task, self._options(run, flag, remaining, reuse)):
                        outcomes.append(self._outcome(self.study.runs[ended.tag], ended.summary, ended.error,
                                                      ended.wall_s))
                if batch is not None and len(batch):
                    for ended in batch.step():
                        outcomes.append(self._outcome(self.study.runs[ended.tag], ended.summary, ended.error,
                                                      ended.wall_s))
        finally:
            if batch is not None:
                batch.close()

    def _options(self, run: StudyRun, flag: StopSource, remaining: float | None, reuse: dict) -> RunOptions:
        o = self.options
        again = run.name in self.rerun  # (a changed run of a resumed study: from generation 1)
        return RunOptions(overwrite=o.overwrite or again, resume=o.resume and not again, quiet=True,
                          deadline=remaining, stop=flag, stream=o.stream, face=o.face, reuse=reuse)

    def _outcome(self, run: StudyRun, summary: dict[str, Any] | None, error: BaseException | None,
                 wall_s: float) -> dict[str, Any]:
        """What the journal records of a run that ended: its summary's figures, or its error (a
        checkpoint that could not be written also halts the study: the disk is likely full)."""
        base = {"run": run.name, "task": run.index}
        if isinstance(error, CheckpointError):
            return {**base, "status": "failed", "error": str(error), "wall_s": wall_s,
                    "halt": "a checkpoint could not be written", "fatal": error.exit_code}
        if error is not None:
            return {**base, "status": "failed", "error": str(error), "wall_s": wall_s}
        assert summary is not None
        out = {**base, "status": summary["status"], "generations": summary["generations"],
               "evaluations": summary["evaluations"], "best_fitness": summary.get("best_fitness"),
               "state_digest": summary["state_digest"], "wall_s": wall_s,
               **{k: summary[k] for k in ("f_opt", "best_precision") if k in summary}}
        if summary["status"] == "stopped":
            out["halt"] = summary.get("stopped_by") or "a stop request"
        return out

    # -- rank 0: what to run, the journal, the voice ------------------------------------------------
    def _prepare(self) -> list[int]:
        """The runs this launch must run, longest first; the journal opened."""
        study, o = self.study, self.options
        if o.resume and o.overwrite:
            raise UsageError(f"{rundir.option('overwrite')} and {rundir.option('resume')} exclude each other")
        runs_dir = study.out / "runs"
        if runs_dir.is_symlink():
            raise UsageError(f"study directory '{study.out}': 'runs' is a symbolic link (to {os.readlink(runs_dir)}): "
                             "a study writes its runs into its own runs/ folder, never through a link planted "
                             "there (they would land outside the study); remove it")
        found = states(study)
        mine = {r.index for r in self.mine}
        here = [s for s in found if s.run.index in mine]
        path = journal_path(study.out, o.part)
        if not o.resume and not o.overwrite:
            begun = [s for s in here if s.state != "pending"]
            if begun or path.exists():
                raise UsageError(
                    f"study directory '{study.out}' already holds this study ({len(begun)} of its {len(here)} runs "
                    f"begun): {rundir.option('resume')} continues it, {rundir.option('overwrite')} starts it again")
            todo = here
        elif o.overwrite:
            for p in journal_files(study.out):
                if p == path or o.part is None:
                    p.unlink()
            todo = here
        else:
            self.rerun = self._changed(here)
            skip = ("done",) if o.retry_failed else ("done", "failed")
            todo = [s for s in here if s.state not in skip or s.run.name in self.rerun]
        self.counts_before = {st: sum(s.state == st for s in here) for st in ("done", "failed")}
        self.journal = Journal(path)
        self._write_copy()
        self.journal.write({"event": "study", "time": time.time(), "ranks": self.world.size,
                            "ranks_per_run": study.ranks_per_run, "batch": study.batch, "runs": len(here),
                            "to_run": len(todo),
                            "resume": o.resume, "part": list(o.part) if o.part else None,
                            "overrides": list(study.overrides)})
        self.todo_count = len(todo)
        order = sorted(todo, key=lambda s: (-s.run.cost(), s.run.configuration, s.run.problem, s.run.index))
        return [r.index for r in spread_programs([s.run for s in order])]

    def _changed(self, here: list) -> set[str]:
        """The begun runs whose config the study now changes in a key that alters results; a
        UsageError naming each key, its values and its runs, unless ``rerun_changed``."""
        recorded: dict[str, dict] = {}
        for e in read_events(self.study.out):
            if e.get("event") == "start" and isinstance(e.get("config"), dict):
                recorded[e["run"]] = e["config"]  # (the last start of each run)
        diffs: dict[tuple[str, str, str], list[str]] = {}
        for state in here:
            run = state.run
            if state.state == "pending" or run.name not in recorded:
                continue  # (a run begun before runs were recorded: its own resume checks it)
            for key, was, now in config_changes(recorded[run.name], run.data):
                diffs.setdefault((key, was, now), []).append(run.name)
        changed = {name for names in diffs.values() for name in names}
        if changed and not self.options.rerun_changed:
            lines = []
            for (key, was, now), names in sorted(diffs.items()):
                shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                lines.append(f"{key}: was {was}, now {now} ({len(names)} run{'s' if len(names) != 1 else ''}: {shown})")
            raise UsageError(
                f"study directory '{self.study.out}': the study file changes {len(changed)} run"
                f"{'s' if len(changed) != 1 else ''} that already began, in settings that change results:\n  "
                + "\n  ".join(lines) + "\n  resuming would mix runs of both settings in one report. Undo the change; "
                f"or start the changed runs again from generation 1 ({rundir.option('rerun_changed')}); or start the "
                f"whole study again ({rundir.option('overwrite')}). Free to change on resume: {', '.join(STUDY_FREE)}")
        return changed

    def _write_copy(self) -> None:
        """The study file beside its runs, for the record (what ``report`` and ``status`` show)."""
        src = self.study.path
        if src is not None and src.is_file():
            target = self.study.out / "study.toml"
            if not (target.exists() and target.resolve() == src.resolve()):
                rundir.write_new(target, src.read_bytes())  # (array tasks may write it at once)

    def _event(self, e: dict[str, Any]) -> None:
        """The dispatcher's events (rank 0, its thread): the journal and a line per run."""
        assert self.journal is not None
        rpr = self.study.ranks_per_run
        if e["event"] == "start":
            run = self.study.runs[e["task"]]
            ranks = list(range(e["group"] * rpr, (e["group"] + 1) * rpr))
            hosts = sorted({self.world.rank_hosts[r] for r in ranks}) if self.world.rank_hosts else []
            # (a group's ranks are busy from its first run in flight to its last: a batch's runs overlap)
            if not self.in_flight.get(e["group"]):
                self.started[e["group"]] = e["time"]
            self.in_flight[e["group"]] = self.in_flight.get(e["group"], 0) + 1
            # (its config as the study expanded it: what a resume compares the study file with)
            self.journal.write({"event": "start", "time": e["time"], "run": run.name, "group": e["group"],
                                "ranks": ranks, "hosts": hosts, "config": run.data})
        elif e["event"] == "end":
            self.in_flight[e["group"]] = max(0, self.in_flight.get(e["group"], 0) - 1)
            if not self.in_flight[e["group"]]:
                self.busy += (e["time"] - self.started.pop(e["group"], e["time"])) * rpr
            record = {k: v for k, v in e.items() if k not in ("task", "halt")}
            self.journal.write(record)
            self.ended.append(record)
            if e.get("fatal"):
                self.fatal = self.fatal or int(e["fatal"])
            if not self.options.quiet:
                self._say(self._line(record))
        else:
            self.journal.write({k: v for k, v in e.items()})

    def _line(self, r: dict[str, Any]) -> str:
        n, total = len(self.ended), self.todo_count
        head = f"[{n:>{len(str(total))}}/{total}] {r['status']:<8} {r['run']}"
        if r["status"] == "failed":
            return f"{head}: {str(r.get('error', '')).splitlines()[0] if r.get('error') else ''}"
        best = r.get("best_fitness")
        value = f"best {best:.4e}" if isinstance(best, (int, float)) else "multi-objective"
        if r.get("f_opt") and isinstance(r.get("best_precision"), (int, float)):  # (BBOB, CEC: their targets')
            value += f"  f-f_opt {r['best_precision']:.2e}"
        return f"{head}  {value}  gen {r.get('generations')}  {r['wall_s']:.1f} s  (group {r['group']})"

    def _banner(self, n: int, groups) -> str:
        s, w = self.study, self.world
        part = f" (slice {self.options.part[0]} of {self.options.part[1]})" if self.options.part else ""
        before = getattr(self, "counts_before", {})
        skipped = ", ".join(f"{v} {k} skipped" for k, v in before.items() if v and (k == "done" or not (
            self.options.retry_failed or self.options.overwrite)))
        left = f"; {groups.idle} rank{'s' if groups.idle != 1 else ''} left over" if groups.idle else ""
        return (f"study {s.name}{part}: {len(self.mine)} runs{' (' + skipped + ')' if skipped else ''}, {n} to run "
                f"on {w.size} rank{'s' if w.size != 1 else ''} as {groups.count} group"
                f"{'s' if groups.count != 1 else ''} of {s.ranks_per_run}{left} -> {s.out}")

    def _say(self, text: str, err: bool = False) -> None:
        stream = sys.stderr if err else (self.options.stream or sys.stdout)
        print(text, file=stream, flush=True)

    def _finish(self, t0: float, groups, left: list[int]) -> StudyResult:
        wall = time.time() - t0
        payload = None
        if self.world.is_root:
            found = states(self.study)
            mine = {r.index for r in self.mine}
            counts = {st: sum(s.state == st and s.run.index in mine for s in found)
                      for st in ("done", "failed", "stopped", "running", "pending")}
            idle = max(0.0, 1.0 - self.busy / max(wall * self.world.size, 1e-9))
            if self.fatal:
                code, status = self.fatal, "failed"
            elif left or counts["stopped"] or counts["running"] or counts["pending"]:
                code, status = EXIT_STOPPED, "stopped"
            elif counts["failed"]:
                code, status = EXIT_RUNS_FAILED, "failed"
            else:
                code, status = 0, "complete"
            assert self.journal is not None
            self.journal.write({"event": "finished", "time": time.time(), "status": status, "counts": counts,
                                "wall_s": wall, "idle": idle})
            self.journal.close()
            payload = (status, counts, self.ended, idle, code)
            if not self.options.quiet:
                self._say(self._closing(status, counts, wall, idle))
        status, counts, ended, idle, code = bcast_from_root(self.world, payload)
        return StudyResult(status, counts, ended, wall, idle, self.study.out, code)

    def _closing(self, status: str, counts: dict[str, int], wall: float, idle: float) -> str:
        text = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        line = f"study {self.study.name}: {text or 'no runs'} in {wall:.1f} s, {idle:.1%} of rank-time idle"
        if status == "stopped":
            line += f"; continue with {rundir.option('resume')} (exit code {EXIT_STOPPED})"
        elif counts.get("failed"):
            line += (f"; failed runs are in {journal_path(self.study.out, self.options.part)} (run them again: "
                     f"{rundir.option('resume')} {rundir.option('retry_failed')})")
        return line


def spread_programs(runs: list[StudyRun]) -> list[StudyRun]:
    """``runs`` (longest first) with the runs of one cost taken program by program in turn: the
    first run of each program, then the second of each, and so on. In the plain order the runs of
    one program sat side by side, so every group took one at the same moment and each compiled
    the same program (a 2-group BBOB slice compiled each of its programs twice, in parallel).
    Spread, the groups compile different programs, and a program's later runs, by then in the
    compilation cache, load it."""
    out: list[StudyRun] = []
    i = 0
    while i < len(runs):
        j = i
        while j < len(runs) and runs[j].cost() == runs[i].cost():
            j += 1
        by_program: dict[str, list[StudyRun]] = {}
        for r in runs[i:j]:
            by_program.setdefault(r.program, []).append(r)
        lanes = list(by_program.values())
        for k in range(max(len(lane) for lane in lanes)):
            out.extend(lane[k] for lane in lanes if k < len(lane))
        i = j
    return out


# What a resumed study's runs may change: where and how they log, checkpoint and are bound to
# hardware, and how host evaluations are scheduled (none changes a bit: driver/resume.py's FREE).
# Budgets, targets and run.generations are locked here, unlike a run's resume: a done run is not
# continued, so a study whose runs ended at other generations would report a mixture.
STUDY_FREE = ("run.name", "run.out", "log.every", "log.progress", "checkpoint.*", "fault.*", "parallel.device",
              "parallel.threads_per_rank", "parallel.compile_cache", "parallel.share_gpus",
              "evaluation.concurrency", "evaluation.schedule")


def config_changes(was: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, old value, new value) for each key of a run's config that differs and is not free
    (a key set on one side only is shown as "(not set)": its default may differ)."""
    from ..driver.resume import MISSING, changes

    show = lambda v: "(not set)" if v is MISSING else json.dumps(v)  # noqa: E731
    return [(key, show(a), show(b)) for key, a, b in changes(was, now, STUDY_FREE)]


def _margin(study: Study) -> float:
    """The margin before the deadline: the runs' own (``checkpoint.margin_seconds``), the largest."""
    values = [r.data.get("checkpoint", {}).get("margin_seconds", 60.0) for r in study.runs[:1000]]
    return float(max((v for v in values if isinstance(v, (int, float))), default=60.0))
