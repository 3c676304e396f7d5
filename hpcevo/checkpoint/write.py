"""Writing a checkpoint: every rank of the job together, with parallel HDF5. Collective.

Publishing is atomic: everything goes to ``.gen-....h5.partial`` in the same directory, the
``complete`` attribute is written last, the file is flushed (``MPI_File_sync``) and closed,
then rank 0 renames it into place and fsyncs the directory. A reader sees whole checkpoints or
none; a crash mid-write leaves only a ``.partial`` file, removed by the next run. Metadata values
come from rank 0 (broadcast) so every rank passes identical arguments to HDF5's collective calls.

A failure (full disk, read-only directory) may hit some ranks only. Each stage ends with an
agreement (``parallel.collective_stage``), so every rank raises the same CheckpointError. HDF5
1.10's own collectives are not so careful: a rank whose share of a metadata flush fails leaves
the flush early while the others wait inside it. So a rank with an error waits at most
``STRANDED_AFTER_S`` for the others to agree, and then reports and ends the job itself; and the
close of a failed file, where every rank may be left inside HDF5, runs under a watchdog that
does the same. A failure inside one of HDF5's flushes can leave every rank inside it too, with
no error visible yet; so the flushes and the close of a checkpoint being written run under the
same watchdog, with a longer limit (``stuck_after``, default 300 s) since a healthy flush syncs
the data to disk.

Where h5py was built without MPI (the HDF5 of a GPU node's image, say), a job of several ranks
writes its checkpoints from rank 0 alone, serially: the state is replicated, so rank 0 holds all
of it. The other ranks take part in every agreement, so a failure is still reported on all of
them, and the file is the same as a parallel write would make (same datasets, blocks and
checksums). Slower for large states, and said once at the start of a run (``serial_note``).
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import CheckpointError
from ..parallel import (ParallelContext, abort_if_stuck, allgather_obj, barrier, bcast_from_root,
                        collective_stage)
from .format import FORMAT, FORMAT_VERSION, Snapshot, file_name, oserror_text, partial_name, prune
from .layout import Layout, flatten_state

# How long a rank whose HDF5 call failed waits for the others before concluding they are stuck
# inside HDF5's own collective and ending the job itself. Generous: on a loaded parallel file
# system a healthy rank's metadata flush can take seconds, and waiting only delays a failure
# that is already certain.
STRANDED_AFTER_S = 30.0
Dataset = tuple[str, np.ndarray, "str | None"]  # name, values, PRNG impl of a key (or None)


def write(ctx: ParallelContext, directory: Path, snap: Snapshot, *, keep: int = 3, keep_every: int = 0,
          stuck_after: float = 300.0, layout: Layout = Layout()) -> Path:
    """Write ``snap`` as a new checkpoint, publish it atomically, prune old ones. Collective.

    ``stuck_after``: seconds after which a collective HDF5 flush or close that has not returned
    is taken as stuck (a rank's write failed inside HDF5, see the module docstring), and the job
    is ended with the checkpoint error's exit code. Raises CheckpointError on every rank if any
    rank failed; the previously published checkpoints are untouched then, and the partial file
    is removed.
    """
    directory = Path(directory)
    serial = serial_writes(ctx)
    final = directory / file_name(snap.generation)
    tmp = partial_name(final)
    w = _Stages(ctx, final, stuck_after)
    meta, datasets = _metadata(ctx, snap), _datasets(snap)
    with w.stage("creating the directory", in_hdf5=False):
        if ctx.is_root:
            directory.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
    with w.stage("creating the file"):
        f = _open(ctx, tmp, "w", serial)
    handles: list = []
    published = False
    try:
        with w.stage("creating datasets"):
            if f is not None:
                _create_datasets(f, meta, datasets, handles)
        with w.stage("writing data"):
            # serially, rank 0 writes every block, as the one rank of a one-rank job would (the
            # others hold no dataset handles, so they write nothing)
            writer = (0, 1) if serial else (ctx.rank, ctx.size)
            crcs = _write_blocks(writer, datasets, handles, layout)
        everyone = allgather_obj(ctx, crcs)
        with w.stage("finishing the file"):
            if f is not None:
                _finish(f, datasets, handles, everyone, layout, lambda: w.guard("finishing the file"))
        with w.stage("closing the file"):
            closing, f = f, None
            if closing is not None:
                _close(closing, handles, lambda: w.guard("closing the file"))
        with w.stage("publishing", in_hdf5=False):
            if ctx.is_root:
                _publish(tmp, final, synced=ctx.size > 1 and not serial)
                # (inside the stage: when write returns on any rank, the directory holds what it
                # will hold, retention included; prune never raises)
                prune(directory, keep=keep, keep_every=keep_every, written=final)
        published = True
    except BaseException as e:
        if f is not None and serial:  # rank 0 alone holds the file: no collective close
            try:
                f.close()
            except Exception:  # noqa: BLE001
                _never_touch_again(f, handles)
        elif f is not None:
            if getattr(e, "stranded", False):  # the others are stuck in HDF5 and the job is ending
                _never_touch_again(f, handles)
            else:
                _close_failed(ctx, f, handles, tmp, str(e), w.stranded_after)
        raise
    finally:
        if not published and ctx.is_root:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
    return final


class _Stages:
    """The agreement after each stage, and the watchdog around HDF5's collective flush and close."""

    def __init__(self, ctx: ParallelContext, final: Path, stuck_after: float):
        self.ctx, self.final, self.stuck_after = ctx, final, stuck_after
        # A rank that knows of an error must give up on the others before their watchdogs fire,
        # so that it is the one that reports.
        self.stranded_after = min(STRANDED_AFTER_S, stuck_after / 2)

    def stage(self, name: str, *, in_hdf5: bool = True):
        def convert(error: BaseException) -> BaseException:
            out = error if isinstance(error, CheckpointError) else CheckpointError(
                f"cannot write checkpoint '{self.final}' ({name}): {oserror_text(error)}")
            out.stranded = getattr(error, "stranded", False)
            return out

        return collective_stage(self.ctx, stranded_after=self.stranded_after if in_hdf5 else None,
                                convert=convert)

    def guard(self, name: str):
        # A rank whose share of HDF5's metadata writes fails can leave every rank inside HDF5,
        # in different collectives, where no agreement reaches them.
        return abort_if_stuck(self.ctx, self.stuck_after, CheckpointError.exit_code, (
            f"cannot write checkpoint '{self.final}' ({name}): HDF5's collective call had not returned "
            f"after {self.stuck_after:g} s (checkpoint.stuck_seconds); a rank's write probably failed "
            f"inside HDF5: check the space and permissions of '{self.final.parent}'. The job was ended; "
            "the checkpoints written before are intact: fix the directory, then --resume"))


def _metadata(ctx: ParallelContext, snap: Snapshot) -> dict:
    from ..provenance import versions

    return bcast_from_root(ctx, {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "generation": int(snap.generation),
        "evaluations": int(snap.evaluations),
        "num_init": int(snap.num_init),
        "num_ask": int(snap.num_ask),
        "seed": int(snap.seed),
        "ranks": ctx.size,
        "hosts": json.dumps(ctx.hosts),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hpcevo_version": __version__,
        "versions": json.dumps(versions(), sort_keys=True),
        "config": snap.config_text,
        # repr-exact: a float survives JSON bit for bit, so the resumed run continues bitwise
        "params": json.dumps(snap.params, sort_keys=True),
    })


def _datasets(snap: Snapshot) -> list[Dataset]:
    datasets = flatten_state(snap.state)
    for field, values in sorted(snap.history.items()):
        datasets.append((f"history/{field}", np.asarray(values), None))
    return datasets


def serial_writes(ctx: ParallelContext) -> bool:
    """Whether this job's checkpoints are written by rank 0 alone (several ranks, h5py without MPI)."""
    from ..provenance import parallel_hdf5

    return ctx.size > 1 and not parallel_hdf5()


def serial_note(ctx: ParallelContext) -> str | None:
    """The line a run prints at its start when its checkpoints are written serially."""
    if not serial_writes(ctx):
        return None
    import h5py

    return (f"note: h5py {h5py.__version__} was built without MPI: rank 0 writes the checkpoints alone "
            "(the state is replicated; the file is the same, the write slower for a large state). "
            "A parallel HDF5 build (scripts/setup.sh) writes them from every rank")


def _open(ctx: ParallelContext, path: Path, mode: str, serial: bool):
    """The file, opened collectively; serially, on rank 0 only (None on the others)."""
    import h5py

    if serial:
        return h5py.File(path, mode) if ctx.is_root else None
    if ctx.size > 1:
        return h5py.File(path, mode, driver="mpio", comm=ctx.comm_ctl)
    return h5py.File(path, mode)


def _create_datasets(f, meta: dict, datasets: list[Dataset], handles: list) -> None:
    """Collective: the attributes and every dataset, in the same order on every rank."""
    for k, v in meta.items():
        f.attrs[k] = v
    f.attrs["complete"] = False
    for name, arr, impl in datasets:
        d = f.create_dataset(name, shape=arr.shape, dtype=arr.dtype)
        if impl is not None:
            d.attrs["prng_impl"] = impl
        handles.append(d)


def _write_blocks(writer: tuple[int, int], datasets: list[Dataset], handles: list,
                  layout: Layout) -> list[list[tuple[int, int]]]:
    """Independent writes, each rank (``writer``: its rank and the number of writers) its own
    blocks; returns (block, CRC) per dataset. A failure (a full disk) may hit some ranks only: it
    is agreed on before the next collective call."""
    rank, size = writer
    crcs: list[list[tuple[int, int]]] = [[] for _ in datasets]
    for i, ((_, arr, _), d) in enumerate(zip(datasets, handles)):
        rows, _ = layout.blocks(arr.shape, arr.dtype.itemsize)
        mine = layout.my_blocks(rank, size, arr.shape, arr.dtype.itemsize, arr.nbytes)
        if not arr.shape:
            if mine:
                d[()] = arr
                crcs[i].append((0, layout.crc(arr, 0, 0)))
            continue
        if mine:
            lo, hi = mine.start * rows, min(arr.shape[0], mine.stop * rows)
            if hi > lo:
                d[lo:hi] = arr[lo:hi]
            crcs[i].extend((b, layout.crc(arr, rows, b)) for b in mine)
    return crcs


def _finish(f, datasets: list[Dataset], handles: list, everyone: list, layout: Layout, guard) -> None:
    """Collective: the checksum tables, a flush, ``complete``, a flush (``guard()``: the watchdog)."""
    for i, ((_, arr, _), d) in enumerate(zip(datasets, handles)):
        rows, nblocks = layout.blocks(arr.shape, arr.dtype.itemsize)
        table = np.zeros(nblocks, np.uint32)
        for rank_crcs in everyone:
            for b, c in rank_crcs[i]:
                table[b] = c
        d.attrs["crc32"] = table
        d.attrs["crc_rows"] = rows
    with guard():
        f.flush()
    f.attrs["complete"] = True
    with guard():
        f.flush()


def _close(f, handles: list, guard) -> None:
    try:
        with guard():
            f.close()
    except Exception:
        _never_touch_again(f, handles)
        raise


def _publish(tmp: Path, final: Path, synced: bool) -> None:
    if not synced:  # with MPI-IO, the flush above already synced (MPI_File_sync)
        _fsync(tmp)
    os.replace(tmp, final)
    _fsync(final.parent)


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
