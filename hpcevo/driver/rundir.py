"""The run directory: the one owner of its files, their names and their record formats.

    <run dir>/config.toml      the resolved config (every default filled in)
    <run dir>/metrics.jsonl    one JSON record per log boundary
    <run dir>/summary.json     the outcome, written when the run completes
    <run dir>/failures.jsonl   host problems: one JSON record per failed evaluation
    <checkpoint dir>/          gen-NNNNNNNNN.h5 (``hpcevo.checkpoint``); default <run dir>/checkpoints

``RunDir`` writes them during a run (collectively: rank 0 writes, every rank learns the outcome);
the module functions read them on one process (``hpcevo inspect``, ``plot``, ``hpcevo.open_run``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import fcntl
import json
import os
import secrets
import socket
import shutil
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from .. import checkpoint
from ..errors import UsageError
from ..parallel import ParallelContext, bcast_from_root, collective_stage

CONFIG, METRICS, SUMMARY, FAILURES = "config.toml", "metrics.jsonl", "summary.json", "failures.jsonl"
RUN_FILES = (CONFIG, METRICS, SUMMARY, FAILURES)
COCO = "coco"  # COCO's data of a run with log.coco (driver/coco_log.py)
# Where --overwrite keeps the run it replaces (in the run directory, and in a checkpoint
# directory outside it) until the new run's first generation has been evaluated: a start that
# fails before (a config refused once its problem is built, every evaluation failing, an
# interrupt while compiling) puts it back, so a refused --overwrite loses nothing.
ASIDE = ".hpcevo-replaced"
LOCK = ".hpcevo-lock"  # held by the launch writing the directory (``DirLock``)

# Which face started the run: "api" (hpcevo.run) or "cli" (hpcevo run). Messages that tell the
# caller what to pass next name it in that face's words (``resume=True``, ``--resume``). A
# context variable, because the messages are raised deep inside the run; each thread starts
# with the default, so a run started from a thread speaks Python.
FACES = ("api", "cli")
_FACE: contextvars.ContextVar[str] = contextvars.ContextVar("hpcevo_face", default="api")


@contextlib.contextmanager
def speaking(face: str) -> Iterator[None]:
    """Messages raised inside name the options as ``face`` ("api" or "cli") spells them."""
    token = _FACE.set(face)
    try:
        yield
    finally:
        _FACE.reset(token)


def face() -> str:
    """The face messages speak now ("api" unless inside ``speaking("cli")``)."""
    return _FACE.get()


def option(name: str, face: str | None = None) -> str:
    """A flag of ``hpcevo run`` as ``face`` (default: the one speaking now) passes it:
    ``--resume``, or ``resume=True``."""
    return f"--{name.replace('_', '-')}" if (face or _FACE.get()) == "cli" else f"{name}=True"


@dataclasses.dataclass(frozen=True)
class RunPaths:
    root: Path
    checkpoints: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def failures(self) -> Path:
        return self.root / FAILURES

    @classmethod
    def of(cls, root: str | Path, checkpoint_dir: str | Path | None = None) -> "RunPaths":
        root = Path(root)
        return cls(root, Path(checkpoint_dir) if checkpoint_dir else root / "checkpoints")

    @classmethod
    def find(cls, root: str | Path) -> "RunPaths":
        """The paths of an existing run directory (its config may move the checkpoints)."""
        root = Path(root)
        ckdir = None
        if (root / CONFIG).is_file():
            try:
                ckdir = tomllib.loads((root / CONFIG).read_text()).get("checkpoint", {}).get("dir")
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
                ckdir = None
        return cls.of(root, ckdir)


class DirLock:
    """One launch writes a run (or a study) directory at a time: an exclusive ``flock`` on the
    file ``LOCK`` in it, held by this process (rank 0) from before anything is touched until the
    launch ends (the kernel drops it when the process dies, however it dies). A second launch,
    from this machine or another sharing the file system, stops with one message naming the
    holder. (Two launches of one run, a job submitted twice, tore each other's metrics.jsonl.)
    Where the file system has no locks, the directory is used unlocked, as before."""

    def __init__(self, fd: int | None):
        self.fd = fd

    @classmethod
    def take(cls, folder: Path, what: str, name: str = LOCK) -> "DirLock":
        if os.path.lexists(folder) and not folder.is_dir():
            raise UsageError(f"{what} is a file, not a folder: name a directory (a new one is made)")
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            try:
                h = json.loads(holder)
                by = (f" (process {h['pid']} on {h['host']}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h['since']))})")
            except (ValueError, KeyError, TypeError, OverflowError):
                by = ""
            raise UsageError(f"{what} is being written by another launch{by}: one launch at a time writes it (two "
                             "would tear each other's files). Wait for that one to end (or stop it), or use another "
                             "directory") from None
        except OSError:  # no locks on this file system (ENOLCK, EOPNOTSUPP)
            os.close(fd)
            return cls(None)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(), 0)
        return cls(fd)

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # (the file stays: removing it would let a third launch lock another inode)


class RunDir:
    """A run directory being written by the ranks of ``ctx`` (rank 0 writes).

    Nothing outside the run is written or deleted: every file is written without following a
    symbolic link (a new file under a temporary name, renamed over the old entry; appends open
    with O_NOFOLLOW), and ``--overwrite`` deletes only this run's own files: the four files
    above, and checkpoints in a checkpoint directory that belongs to this run (inside the run
    directory, or marked as this run's by ``OWNER``). Every method is collective: rank 0's
    failure (a full disk) is every rank's error.
    """

    def __init__(self, ctx: ParallelContext, paths: RunPaths):
        self.ctx, self.paths = ctx, paths
        self._aside: list[tuple[Path, Path]] = []  # (where it was, where it is now): rank 0's
        self._lock = DirLock(None)  # rank 0's, from prepare to close
        self.replacing = False  # (every rank) --overwrite set a run aside, not yet committed

    def unwritable(self, error: BaseException) -> BaseException:
        """An OSError while writing the run directory, as the UsageError that reports it."""
        if isinstance(error, OSError):
            where = error.filename or self.paths.root
            why = "it is a symbolic link" if error.errno == errno.ELOOP else error.strerror
            return UsageError(f"run directory '{self.paths.root}': '{where}' cannot be written: {why}")
        return error

    @contextlib.contextmanager
    def converting(self) -> Iterator[None]:
        """An OSError of the block as ``unwritable``'s UsageError where it happens: the other
        ranks rebuild what they are told, and an OSError reached them as a bare RuntimeError."""
        try:
            yield
        except OSError as e:
            raise self.unwritable(e) from None

    def _root_writes(self, fn: Callable[[], None]) -> None:
        with collective_stage(self.ctx), self.converting():
            if self.ctx.is_root:
                fn()

    def prepare(self, overwrite: bool, resume: bool) -> None:
        """Check and create the directories. Collective.

        An existing run is continued only with ``resume``, replaced only with ``overwrite``: never
        silently. Both directories are probed for writing now, not an hour into the run. With
        ``overwrite`` the old run is set aside (``ASIDE``) until ``commit``; ``abandon`` puts it
        back.
        """
        self._root_writes(lambda: self._prepare(overwrite, resume))
        self.replacing = bool(bcast_from_root(self.ctx, bool(self._aside) if self.ctx.is_root else None))

    def _prepare(self, overwrite: bool, resume: bool) -> None:
        out, ckdir = self.paths.root, self.paths.checkpoints
        self._lock = DirLock.take(out, f"run directory '{out}'")
        try:
            self._prepare_locked(overwrite, resume)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """The launch is over (rank 0's lock released; every rank calls it)."""
        self._lock.release()

    def _prepare_locked(self, overwrite: bool, resume: bool) -> None:
        out, ckdir = self.paths.root, self.paths.checkpoints
        for d in dict.fromkeys((out, ckdir)):
            if os.path.lexists(d / ASIDE):
                raise UsageError(
                    f"'{d / ASIDE}' holds the run that an earlier {option('overwrite')} set aside, and that start "
                    "ended before its first generation (killed?): nothing of that run is lost. To keep it, move "
                    f"its files back into '{d}' (replacing what is there); to drop it, remove the folder. Then "
                    "start again")
        existing = [f for f in (*RUN_FILES, COCO) if os.path.lexists(out / f)]
        checkpoints = checkpoint.list_checkpoints(ckdir)
        if checkpoints:
            existing.append(f"{len(checkpoints)} checkpoint(s) in {ckdir}")
        if existing and not (overwrite or resume):
            another = "--set run.out=DIR" if face() == "cli" else "another run.out (or run.name) in the config"
            raise UsageError(
                f"run directory '{out}' already holds a run ({', '.join(existing)}); pass {option('resume')} "
                f"to continue it, {option('overwrite')} to replace it, or choose another with {another}")
        self._check_owner(checkpoints, overwrite)
        if existing and overwrite:
            self._set_aside([out / f for f in (*RUN_FILES, COCO) if os.path.lexists(out / f)] + checkpoints)
        try:
            links = [f for f in RUN_FILES if (out / f).is_symlink()]
            if links:
                raise UsageError(f"run directory '{out}': {', '.join(links)} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'} "
                                 f"(to {os.readlink(out / links[0])}): hpcevo writes no file of a run through a link; "
                                 f"remove it, or pass {option('overwrite')} (which removes the link, not what it points "
                                 "to)")
            for d in (out, ckdir):
                d.mkdir(parents=True, exist_ok=True)
                probe = d / f".write-test-{os.getpid()}"
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
                probe.unlink()
            if not _inside(ckdir, out):
                write_new(ckdir / OWNER, json.dumps({"run_dir": str(out.resolve())}) + "\n")
            checkpoint.remove_partials(ckdir)
        except BaseException:
            self._restore()
            raise

    def _set_aside(self, paths: list[Path]) -> None:
        """Move ``paths`` (entries of the run, links as links) into ``ASIDE`` beside them (rank 0)."""
        try:
            for path in paths:
                aside = path.parent / ASIDE
                if not aside.is_dir():
                    aside.mkdir(mode=0o700)
                os.rename(path, aside / path.name)
                self._aside.append((path, aside / path.name))
        except BaseException:
            self._restore()
            raise

    def commit(self) -> None:
        """The new run has started: drop the run ``--overwrite`` set aside. Rank 0, local (every
        rank calls it; a folder that cannot be removed is named by the next start)."""
        moved, self._aside, self.replacing = self._aside, [], False
        for folder in dict.fromkeys(dest.parent for _, dest in moved):
            shutil.rmtree(folder, ignore_errors=True)

    def abandon(self) -> None:
        """The new run did not start: remove what it wrote and put the replaced run back. Rank 0,
        local and never raising (it runs while an error, or an interrupt, ends the start)."""
        if not self._aside:
            return
        out, ckdir = self.paths.root, self.paths.checkpoints
        new = [out / f for f in (*RUN_FILES, COCO)] + checkpoint.list_checkpoints(ckdir)
        for path in new:
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    path.unlink()
            except Exception:
                pass
        with contextlib.suppress(Exception):
            checkpoint.remove_partials(ckdir)
        self._restore()
        self.replacing = False

    def _restore(self) -> None:
        """Every entry set aside back where it was; the ``ASIDE`` folders removed once empty (one
        that keeps an entry stays, and the next start names it)."""
        moved, self._aside = self._aside, []
        for path, dest in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(dest, path)
        for folder in dict.fromkeys(dest.parent for _, dest in moved):
            with contextlib.suppress(OSError):
                folder.rmdir()

    def _check_owner(self, checkpoints: list[Path], overwrite: bool) -> None:
        """The checkpoint directory must be this run's: resuming from, or overwriting, another
        run's checkpoints would continue or destroy that run. (Checkpoints no run claims, from
        before runs marked their directories, may be resumed, which claims them, but are never
        deleted.)"""
        out, ckdir = self.paths.root, self.paths.checkpoints
        owner = checkpoint_owner(ckdir)
        if owner is not None and owner.exists() and not _same(owner, out):
            raise UsageError(f"checkpoint directory '{ckdir}' belongs to the run in '{owner}', not to this run "
                             f"('{out}'): hpcevo neither continues nor deletes another run's checkpoints; set "
                             "checkpoint.dir to a directory of this run's")
        if overwrite and owner is None and checkpoints and not _inside(ckdir, out):
            raise UsageError(f"checkpoint directory '{ckdir}' (outside the run directory '{out}') holds "
                             f"{len(checkpoints)} checkpoint(s) that no run claims (no {OWNER} file): "
                             f"{option('overwrite')} deletes only checkpoints it can tell are this run's; move them "
                             "away, or set checkpoint.dir to another directory")

    def start(self, config_text: str, resumed_at: int | None) -> None:
        """Write the resolved config; a resumed run keeps the records up to its checkpoint (it
        writes the rest again) and no run keeps failures of generations still to come."""
        def write() -> None:
            write_new(self.paths.config, config_text)
            if resumed_at is not None:
                truncate_records(self.paths.metrics, resumed_at)
            truncate_records(self.paths.failures, resumed_at or 0)

        self._root_writes(write)

    def metrics_writer(self, append: bool) -> "RecordWriter":
        return RecordWriter(self.paths.metrics if self.ctx.is_root else None, append)

    def append_failures(self, records: list[dict]) -> None:
        """Collective (rank 0 alone holds the records)."""
        def write() -> None:
            if records:
                with _open_append(self.paths.failures) as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in records)

        self._root_writes(write)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Collective: every rank returns once summary.json is in place (a script that reads it
        right after ``hpcevo.run`` finds it on any rank)."""
        self._root_writes(lambda: write_new(self.paths.summary, json.dumps(summary, indent=2) + "\n"))


# A checkpoint directory outside its run directory names its run here (JSON: {"run_dir": ...}).
OWNER = ".hpcevo-run"


def checkpoint_owner(ckdir: Path) -> Path | None:
    """The run directory a checkpoint directory belongs to, as far as can be told: its ``OWNER``
    file, else (a run's default layout) the parent of a ``checkpoints`` directory holding a
    config.toml; None when unknown."""
    try:
        with open(ckdir / OWNER, "rb") as f:
            return Path(json.loads(f.read(4096))["run_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if ckdir.name == "checkpoints" and (ckdir / ".." / CONFIG).is_file():
        return ckdir.parent if not ckdir.is_symlink() else ckdir.resolve().parent
    return None


def _inside(path: Path, root: Path) -> bool:
    """``path`` (links resolved) is ``root`` or inside it."""
    return path.resolve().is_relative_to(root.resolve())


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def write_new(path: Path, data: str | bytes) -> None:
    """Write ``path`` whole and atomically, never through a link: a new file (created
    exclusively, so no link planted under its temporary name is followed) renamed over
    whatever entry ``path`` was (a link is replaced, not followed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _open_append(path: Path, truncate: bool = False) -> TextIO:
    """``path`` opened for appending (or rewriting), refusing a symbolic link (OSError ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if truncate else os.O_APPEND)
    return os.fdopen(os.open(path, flags, 0o644), "w")


class RecordWriter:
    """JSON lines appended and flushed one at a time (a no-op on ranks other than 0)."""

    def __init__(self, path: Path | None, append: bool):
        self._file = _open_append(path, truncate=not append) if path is not None else None

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        # Every record was flushed as it was written, or its write failed and was reported (a
        # full disk): what close would flush again is that record, and failing again here would
        # put a bare OSError in place of that one message.
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_records(path: Path, generation: int) -> None:
    """Keep the records up to ``generation`` (and stop at a torn last line from a killed run)."""
    if not path.exists():
        return
    write_new(path, "".join(line + "\n" for line, r in _lines(path) if r["generation"] <= generation))


# -- readers (one process, no MPI) ---------------------------------------------------------------
def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, up to the first that cannot be read (a torn line)."""
    return [record for _, record in _lines(path)]


def _lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if not Path(path).is_file():
        return
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict) or not isinstance(record.get("generation"), int):
            return
        yield line, record


def read_config(paths: RunPaths) -> dict[str, Any] | None:
    """The resolved config as TOML data, or None when the directory has none."""
    if not paths.config.is_file():
        return None
    try:
        return tomllib.loads(paths.config.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"'{paths.config}' is not a readable config: {e}") from None
    except OSError as e:
        raise UsageError(f"'{paths.config}' cannot be read: {e.strerror}") from None


def read_summary(paths: RunPaths) -> dict[str, Any] | None:
    """summary.json as a dict, or None when the run has not completed."""
    if not paths.summary.is_file():
        return None
    try:
        data = json.loads(paths.summary.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"'{paths.summary}' is not readable JSON: {e}") from None
    except OSError as e:
        raise UsageError(f"'{paths.summary}' cannot be read: {e.strerror}") from None
    if not isinstance(data, dict):
        raise UsageError(f"'{paths.summary}' is damaged: it holds a JSON {type(data).__name__}, not a summary")
    return data


def run_config_path(run_dir: str | Path) -> Path:
    """The resolved config a run directory holds (for `hpcevo resume RUN_DIR`)."""
    if not Path(run_dir).is_dir():
        raise UsageError(f"run directory '{run_dir}' not found")
    path = RunPaths.of(run_dir).config
    if not path.is_file():
        raise UsageError(f"'{run_dir}' is not a run directory: it has no config.toml")
    return path
