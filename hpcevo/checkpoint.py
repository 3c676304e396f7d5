"""Checkpoints: one HDF5 file per checkpoint, written by all ranks together (parallel HDF5).

The only module that touches HDF5. A checkpoint file ``gen-000001000.h5`` holds:

    /             attributes: format, format_version, generation, evaluations (and num_init,
                  num_ask: evaluations in generation 1 and in each later one), seed, ranks (that
                  wrote it), created (UTC ISO time), hpcevo_version, versions (JSON), config (the
                  resolved run config, TOML), complete (written last)
    /state/...    one dataset per leaf of the run's state pytree, named by its pytree path
                  (``state/algo/position``), with the leaf's exact dtype and shape; PRNG keys too
                  (typed keys are stored as their key data plus a ``prng_impl`` attribute)
    /history/...  one value per generation so far: best (best-so-far), gen_best, gen_mean,
                  gen_std (of each generation's finite fitness values) and nonfinite (count)

Every dataset carries ``crc32`` (one CRC-32 per block of ``crc_rows`` leading-axis rows) that
loading verifies, so a flipped bit anywhere is found, not resumed from.

Writing scales with ranks: each large dataset's rows are cut into fixed blocks of about
``CRC_BLOCK_BYTES`` (a function of the shape only, never of the rank count), the blocks are
dealt out to ranks in contiguous runs, and every rank writes and checksums only its own blocks.
Small datasets are written once, by rank 0. Metadata values come from rank 0 (broadcast) so
every rank passes identical arguments to HDF5's collective calls.

Publishing is atomic: everything goes to ``.gen-....h5.partial`` in the same directory, the
``complete`` attribute is written last, the file is flushed (``MPI_File_sync``) and closed,
then rank 0 renames it into place and fsyncs the directory. A reader sees whole checkpoints or
none; a crash mid-write leaves only a ``.partial`` file, removed by the next run.

A failure (full disk, read-only directory) may hit some ranks only. Each stage ends with an
agreement, so every rank raises the same CheckpointError. HDF5 1.10's own collectives are not
so careful: a rank whose share of a metadata flush fails leaves the flush early while the others
wait inside it. So a rank with an error waits at most ``STRANDED_AFTER_S`` for the others to
agree, and then reports and ends the job itself; and the close of a failed file, where every
rank may be left inside HDF5, runs under a watchdog that does the same. A failure inside one
of HDF5's flushes can leave every rank inside it too, with no error visible yet; so the flushes
and the close of a checkpoint being written run under the same watchdog, with a longer limit
(``checkpoint.stuck_seconds``, default 300 s) since a healthy flush syncs the data to disk.

Every public function that takes a ``ctx`` is collective over its ranks.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError, UsageError
from .parallel import (ParallelContext, abort_if_stuck, agree_on_error, allgather_obj, barrier, bcast_from_root,
                       shard_of)

FORMAT = "hpcevo-checkpoint"
FORMAT_VERSION = 1
# How long a rank whose HDF5 call failed waits for the others before concluding they are stuck
# inside HDF5's own collective and ending the job itself. Generous: on a loaded parallel file
# system a healthy rank's metadata flush can take seconds, and waiting only delays a failure
# that is already certain.
STRANDED_AFTER_S = 30.0
# The history of a single-objective run; a checkpoint stores whatever per-generation series the
# run keeps (``history/<name>``), so other kinds of runs can keep other series.
HISTORY_FIELDS = ("best", "gen_best", "gen_mean", "gen_std", "nonfinite")
# Row blocks of about this size are the unit of both checksumming and the split between ranks.
CRC_BLOCK_BYTES = 8 << 20
# Below this, a dataset is written by rank 0 alone: splitting a few KiB costs more than it saves.
SPLIT_MIN_BYTES = 1 << 20
_NAME = re.compile(r"^gen-(\d{9,})\.h5$")


class CheckpointDamaged(Exception):
    """A checkpoint file that cannot be trusted (truncated, bad checksum, unfinished)."""


@dataclasses.dataclass
class Snapshot:
    """What a checkpoint holds, on the host. ``state`` is a pytree of arrays (replicated)."""

    generation: int
    evaluations: int
    seed: int
    config_text: str
    state: Any
    history: dict[str, np.ndarray]
    num_init: int  # evaluations in generation 1
    num_ask: int  # evaluations in every later generation


@dataclasses.dataclass
class Header:
    """A checkpoint's root attributes: cheap to read, enough to describe or compare it."""

    path: Path
    generation: int
    evaluations: int
    seed: int
    ranks: int
    created: str
    hpcevo_version: str
    versions: dict[str, str]
    config_text: str
    complete: bool
    num_init: int
    num_ask: int


def file_name(generation: int) -> str:
    return f"gen-{generation:09d}.h5"


def list_checkpoints(directory: Path) -> list[Path]:
    """Published checkpoints in ``directory``, newest (highest generation) first."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), n) for n in names if (m := _NAME.match(n))]
    return [directory / n for _, n in sorted(found, reverse=True)]


# -- pytree <-> named arrays ---------------------------------------------------------------------
def _key_name(entry: Any) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def flatten_state(tree: Any) -> list[tuple[str, np.ndarray, str | None]]:
    """(dataset name, host array, PRNG impl name or None) for every leaf, in pytree order."""
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "state/" + "/".join(_key_name(p) for p in path) if path else "state/value"
        impl = None
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        out.append((name, np.asarray(leaf), impl))
    return out


def _template_leaves(template: Any) -> tuple[list[tuple[str, tuple, np.dtype, bool]], Any]:
    """For a pytree of ShapeDtypeStructs: (name, shape, storage dtype, is key) per leaf, treedef."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        name = "state/" + "/".join(_key_name(p) for p in path) if path else "state/value"
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, leaf)
            out.append((name, tuple(data.shape), np.dtype(data.dtype), True))
        else:
            out.append((name, tuple(leaf.shape), np.dtype(leaf.dtype), False))
    return out, treedef


# -- row blocks: the unit of checksums and of the split between ranks -----------------------------
def _block_rows(shape: tuple, itemsize: int) -> int:
    if not shape:
        return 0
    row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    return max(1, CRC_BLOCK_BYTES // max(1, row_bytes))


def _blocks(shape: tuple, itemsize: int) -> tuple[int, int]:
    """(rows per block, number of blocks); a 0-d array is one block of 0 rows."""
    rows = _block_rows(shape, itemsize)
    if not shape:
        return 0, 1
    return rows, -(-shape[0] // rows) if shape[0] else 0


def _my_blocks(ctx: ParallelContext, shape: tuple, itemsize: int, nbytes: int) -> range:
    rows, nblocks = _blocks(shape, itemsize)
    if not shape or nbytes < SPLIT_MIN_BYTES or ctx.size == 1:
        return range(nblocks) if ctx.is_root else range(0)
    first, count = shard_of(nblocks, 1, ctx.size, ctx.rank)
    return range(first, first + count)


def _crc(arr: np.ndarray, rows: int, block: int) -> int:
    part = arr if not arr.shape else arr[block * rows : (block + 1) * rows]
    return zlib.crc32(memoryview(np.ascontiguousarray(part)).cast("B"))


# -- writing -------------------------------------------------------------------------------------
def _open(ctx: ParallelContext, path: Path, mode: str):
    import h5py

    if ctx.size > 1:
        return h5py.File(path, mode, driver="mpio", comm=ctx.comm_ctl)
    return h5py.File(path, mode)


# What HDF5 and MPI-IO bury in their error stacks, in the words a user searches for.
_REASONS = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded",
            "Input/output error", "No such file or directory", "File exists", "Stale file handle")


def _oserror_text(e: BaseException) -> str:
    text = str(e)
    for reason in _REASONS:
        if reason.lower() in text.lower():
            return reason
    if getattr(e, "strerror", None):
        return e.strerror
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return first

def write(ctx: ParallelContext, directory: Path, snap: Snapshot, *, keep: int = 3,
          keep_every: int = 0, stuck_after: float = 300.0) -> Path:
    """Write ``snap`` as a new checkpoint, publish it atomically, prune old ones. Collective.

    ``stuck_after``: seconds after which a collective HDF5 flush or close that has not returned
    is taken as stuck (a rank's write failed inside HDF5, see the module docstring), and the job
    is ended with the checkpoint error's exit code.

    Raises CheckpointError on every rank if any rank failed; the previously published
    checkpoints are untouched then, and the partial file is removed.
    """
    from . import __version__

    directory = Path(directory)
    final = directory / file_name(snap.generation)
    tmp = directory / f".{final.name}.partial"
    meta = bcast_from_root(ctx, {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "generation": int(snap.generation),
        "evaluations": int(snap.evaluations),
        "num_init": int(snap.num_init),
        "num_ask": int(snap.num_ask),
        "seed": int(snap.seed),
        "ranks": ctx.size,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hpcevo_version": __version__,
        "versions": json.dumps(_versions(), sort_keys=True),
        "config": snap.config_text,
    })
    datasets = flatten_state(snap.state)
    for field, values in sorted(snap.history.items()):
        datasets.append((f"history/{field}", np.asarray(values), None))

    # A rank that knows of an error must give up on the others before their watchdogs (below)
    # fire, so that it is the one that reports.
    stranded_after = min(STRANDED_AFTER_S, stuck_after / 2)

    def fail(stage: str, error: BaseException | None, *, in_hdf5: bool = True) -> None:
        error = agree_on_error(ctx, error, stranded_after=stranded_after if in_hdf5 else None)
        if error is not None:
            out = error if isinstance(error, CheckpointError) else CheckpointError(
                f"cannot write checkpoint '{final}' ({stage}): {_oserror_text(error)}")
            out.stranded = getattr(error, "stranded", False)
            raise out

    def stuck_guard(stage: str):
        # A rank whose share of HDF5's metadata writes fails can leave every rank inside HDF5,
        # in different collectives, where no agreement reaches them.
        return abort_if_stuck(ctx, stuck_after, CheckpointError.exit_code, (
            f"cannot write checkpoint '{final}' ({stage}): HDF5's collective call had not returned "
            f"after {stuck_after:g} s (checkpoint.stuck_seconds); a rank's write probably failed "
            f"inside HDF5: check the space and permissions of '{directory}'. The job was ended; "
            "the checkpoints written before are intact: fix the directory, then --resume"))

    error: BaseException | None = None
    if ctx.is_root:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
        except OSError as e:
            error = e
    fail("creating the directory", error, in_hdf5=False)

    try:
        f = _open(ctx, tmp, "w")
    except OSError as e:
        f, error = None, e
    fail("creating the file", error)

    published = False
    try:
        handles = []
        try:
            for k, v in meta.items():
                f.attrs[k] = v
            f.attrs["complete"] = False
            for name, arr, impl in datasets:
                d = f.create_dataset(name, shape=arr.shape, dtype=arr.dtype)
                if impl is not None:
                    d.attrs["prng_impl"] = impl
                handles.append(d)
        except Exception as e:  # noqa: BLE001 - any failure must reach the other ranks
            error = e
        fail("creating datasets", error)

        # Independent writes: each rank its own blocks. Failures (a full disk) may hit some ranks
        # only; they are agreed on before the next collective HDF5 call.
        crcs: list[list[tuple[int, int]]] = [[] for _ in datasets]
        try:
            for i, ((name, arr, _), d) in enumerate(zip(datasets, handles)):
                rows, _ = _blocks(arr.shape, arr.dtype.itemsize)
                mine = _my_blocks(ctx, arr.shape, arr.dtype.itemsize, arr.nbytes)
                if not arr.shape:
                    if mine:
                        d[()] = arr
                        crcs[i].append((0, _crc(arr, 0, 0)))
                    continue
                if mine:
                    lo, hi = mine.start * rows, min(arr.shape[0], mine.stop * rows)
                    if hi > lo:
                        d[lo:hi] = arr[lo:hi]
                    crcs[i].extend((b, _crc(arr, rows, b)) for b in mine)
        except Exception as e:  # noqa: BLE001
            error = e
        fail("writing data", error)

        everyone = allgather_obj(ctx, crcs)
        try:
            for i, ((_, arr, _), d) in enumerate(zip(datasets, handles)):
                rows, nblocks = _blocks(arr.shape, arr.dtype.itemsize)
                table = np.zeros(nblocks, np.uint32)
                for rank_crcs in everyone:
                    for b, c in rank_crcs[i]:
                        table[b] = c
                d.attrs["crc32"] = table
                d.attrs["crc_rows"] = rows
            with stuck_guard("finishing the file"):
                f.flush()
            f.attrs["complete"] = True
            with stuck_guard("finishing the file"):
                f.flush()
        except Exception as e:  # noqa: BLE001
            error = e
        fail("finishing the file", error)
        try:
            with stuck_guard("closing the file"):
                f.close()
        except Exception as e:  # noqa: BLE001
            error = e
            _never_touch_again(f, handles)
        f = None
        fail("closing the file", error)

        if ctx.is_root:
            try:
                if ctx.size == 1:  # with MPI-IO, the flush above already synced (MPI_File_sync)
                    _fsync(tmp)
                os.replace(tmp, final)
                _fsync(directory)
            except OSError as e:
                error = e
        fail("publishing", error, in_hdf5=False)
        published = True
    except BaseException as e:
        if f is not None:
            if getattr(e, "stranded", False):  # the others are stuck in HDF5 and the job is ending
                _never_touch_again(f, handles)
            else:
                _close_failed(ctx, f, handles, tmp, str(e), stranded_after)
        raise
    finally:
        if not published and ctx.is_root:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass

    if ctx.is_root:
        prune(directory, keep=keep, keep_every=keep_every)
    return final


def _close_failed(ctx: ParallelContext, f, handles: list, tmp: Path, why: str, limit: float) -> None:
    """Close a checkpoint file whose writing failed (collective: every rank gets here together).

    The partial file is emptied first, which gives back the space it took (it is deleted
    afterwards anyway). HDF5 1.10's collective close then flushes the metadata still dirty, and
    on a full disk that write can fail on some ranks only: those skip the flush's closing
    barrier and enter the next collective (the truncate's broadcast) while the others wait in
    the barrier, all inside HDF5, forever (seen in about one run in five of
    tests/test_survive.py's full-disk case). No agreement can reach them there, so a watchdog
    ends the job if the close has not returned in time. If the close fails, HDF5 1.10 leaves the
    file half-torn-down, and touching it again, even at exit, crashes the process: it leaves
    with ``os._exit`` and the checkpoint error's code instead.
    """
    if ctx.is_root:
        try:
            os.truncate(tmp, 0)
        except OSError:
            pass
    barrier(ctx)
    with abort_if_stuck(ctx, limit, CheckpointError.exit_code,
                        f"{why}; the job was ended because HDF5's collective close of the failed file "
                        f"did not return within {limit:g} s"):
        try:
            f.close()
        except Exception:  # noqa: BLE001
            _never_touch_again(f, handles)


_UNCLOSABLE: list = []


def _never_touch_again(*objects) -> None:
    """After a failed H5Fclose: keep the file's objects alive (freeing them runs the close again,
    which crashes) and leave the process with ``os._exit`` before HDF5's cleanup at exit."""
    import atexit
    import sys

    _UNCLOSABLE.append(objects)

    def leave() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(CheckpointError.exit_code)

    atexit.register(leave)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune(directory: Path, *, keep: int, keep_every: int = 0) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (and those at multiples of ``keep_every``)."""
    removed = []
    for i, path in enumerate(list_checkpoints(directory)):
        gen = int(_NAME.match(path.name).group(1))
        if i < keep or (keep_every and gen % keep_every == 0):
            continue
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass  # retention is best effort: a file we cannot delete costs only space
    return removed


def remove_partials(directory: Path) -> None:
    """Drop ``.partial`` files left by a run that died mid-write (rank 0 only)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        if n.startswith(".gen-") and n.endswith(".partial"):
            try:
                (directory / n).unlink()
            except OSError:
                pass


def _versions() -> dict[str, str]:
    from .runner import versions

    return versions()


# -- reading -------------------------------------------------------------------------------------
def _header(f, path: Path) -> Header:
    a = f.attrs
    if a.get("format") != FORMAT:
        raise CheckpointDamaged(f"not an hpcevo checkpoint (format attribute {a.get('format')!r})")
    version = int(a.get("format_version", -1))
    if version != FORMAT_VERSION:
        raise CheckpointDamaged(
            f"checkpoint format version {version}; this hpcevo reads version {FORMAT_VERSION}")
    try:
        return Header(
            path=path,
            generation=int(a["generation"]),
            evaluations=int(a["evaluations"]),
            seed=int(a["seed"]),
            ranks=int(a["ranks"]),
            created=str(a["created"]),
            hpcevo_version=str(a["hpcevo_version"]),
            versions=json.loads(a["versions"]),
            config_text=str(a["config"]),
            complete=bool(a["complete"]),
            num_init=int(a["num_init"]),
            num_ask=int(a["num_ask"]),
        )
    except KeyError as e:
        raise CheckpointDamaged(f"attribute {e.args[0]!r} is missing") from None


def _verify(d, arr: np.ndarray, share: tuple[int, int] | None = None) -> None:
    """Check ``arr`` (read from dataset ``d``) against the checksums stored with it: all blocks, or
    with ``share=(rank, size)`` that rank's part of them. The block size is the one the writer
    chose (``crc_rows``), so files stay readable whatever a later version picks."""
    table = np.asarray(d.attrs.get("crc32", np.zeros(0, np.uint32)))
    rows = int(d.attrs.get("crc_rows", -1))
    if arr.shape:
        nblocks = -(-arr.shape[0] // rows) if rows > 0 else -1
    else:
        nblocks = 1 if rows == 0 else -1
    if nblocks < 0 or table.size != nblocks:
        raise CheckpointDamaged(f"dataset '{d.name}' has no valid checksum table")
    blocks = range(nblocks)
    if share is not None:
        first, count = shard_of(nblocks, 1, share[1], share[0])
        blocks = range(first, first + count)
    for b in blocks:
        if _crc(arr, rows, b) != int(table[b]):
            what = "value" if not arr.shape else f"rows {b * rows}..{min(arr.shape[0], (b + 1) * rows) - 1}"
            raise CheckpointDamaged(f"checksum mismatch in '{d.name}' ({what})")


@dataclasses.dataclass
class Loaded:
    header: Header
    state: Any
    history: dict[str, np.ndarray]


def read_header(ctx: ParallelContext, path: Path) -> Header:
    """Collective. Raises CheckpointDamaged (on every rank) if the file cannot be trusted."""
    error: BaseException | None = None
    header = None
    try:
        with _open(ctx, path, "r") as f:
            header = _header(f, path)
            if not header.complete:
                raise CheckpointDamaged("the file was never completed")
    except CheckpointDamaged as e:
        error = e
    except Exception as e:  # noqa: BLE001 - h5py reports truncation etc. as OSError
        error = CheckpointDamaged(_oserror_text(e))
    error = agree_on_error(ctx, error)
    if error is not None:
        raise CheckpointDamaged(str(error))
    return header


def load(ctx: ParallelContext, path: Path, template: Any) -> Loaded:
    """Read and verify a checkpoint into a state shaped like ``template``. Collective.

    Every rank reads the whole state (it is replicated); each rank verifies the checksums of the
    blocks it would write, so verification is shared. Raises CheckpointDamaged on every rank for
    a file that cannot be trusted, and UsageError when the file is sound but holds a state of a
    different structure than this run's.
    """
    import jax

    specs, treedef = _template_leaves(template)
    error: BaseException | None = None
    result = None
    try:
        with _open(ctx, path, "r") as f:
            header = _header(f, path)
            if not header.complete:
                raise CheckpointDamaged("the file was never completed")
            leaves = []
            for name, shape, dtype, is_key in specs:
                if name not in f:
                    raise UsageError(
                        f"checkpoint '{path}' has no dataset '{name}': it holds the state of a "
                        "different algorithm or hpcevo version than this run")
                d = f[name]
                if tuple(d.shape) != shape or np.dtype(d.dtype) != dtype:
                    raise UsageError(
                        f"checkpoint '{path}': dataset '{name}' is {d.dtype}{tuple(d.shape)}, this run "
                        f"needs {dtype}{shape}: it was written by a different configuration or version")
                arr = d[()]
                arr = np.asarray(arr).reshape(shape)
                _verify(d, arr, (ctx.rank, ctx.size))
                if is_key:
                    impl = str(d.attrs.get("prng_impl", ""))
                    leaves.append(jax.random.wrap_key_data(arr, impl=impl or None))
                else:
                    leaves.append(arr)
            history = {}
            for field in sorted(f.get("history", {})):
                name = f"history/{field}"
                d = f[name]
                arr = np.asarray(d[()])
                _verify(d, arr)
                if arr.shape != (header.generation,):
                    raise CheckpointDamaged(f"'{name}' has {arr.shape[0]} entries for {header.generation} generations")
                history[field] = arr
            result = Loaded(header, jax.tree_util.tree_unflatten(treedef, leaves), history)
    except (CheckpointDamaged, UsageError) as e:
        error = e
    except Exception as e:  # noqa: BLE001 - truncated files surface as OSError/KeyError in h5py
        error = CheckpointDamaged(_oserror_text(e))
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error if isinstance(error, UsageError) else CheckpointDamaged(str(error))
    return result


# -- one process, no MPI: for `hpcevo inspect` ----------------------------------------------------
@dataclasses.dataclass
class Report:
    path: Path
    size_bytes: int
    header: Header | None
    problem: str | None  # None: the file validates
    best: float | None = None
    state_bytes: int = 0


def verify_file(path: Path) -> Report:
    """Open ``path`` on this process alone and check everything: header, every checksum."""
    import h5py

    size = path.stat().st_size if path.exists() else 0
    report = Report(path, size, None, None)
    try:
        with h5py.File(path, "r") as f:
            report.header = _header(f, path)
            if not report.header.complete:
                raise CheckpointDamaged("the file was never completed")
            names: list[str] = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            for name in names:
                d = f[name]
                arr = np.asarray(d[()])
                _verify(d, arr)
                if name.startswith("state/"):
                    report.state_bytes += arr.nbytes
            if "state/best_f" in f:
                report.best = float(f["state/best_f"][()])
    except CheckpointDamaged as e:
        report.problem = str(e)
    except Exception as e:  # noqa: BLE001
        report.problem = _oserror_text(e)
    return report


def read_history(path: Path) -> dict[str, np.ndarray]:
    """The per-generation history stored in a checkpoint (this process alone)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {k: np.asarray(v[()]) for k, v in f["history"].items()}
