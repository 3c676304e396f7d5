"""Reading checkpoints: collectively into a run (``read_header``, ``load``), or on one process
for inspection (``describe``, ``verify_file``, ``read_history``). Every checksum is checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..parallel import ParallelContext, agreed, collective_stage, shard_of
from .format import CheckpointDamaged, Header, header_of, oserror_text
from .layout import block_crc, template_leaves


@dataclasses.dataclass
class Loaded:
    header: Header
    state: Any
    history: dict[str, np.ndarray]


@dataclasses.dataclass
class Report:
    """What one process found in a checkpoint file (``verify_file``, ``describe``)."""

    path: Path
    size_bytes: int
    header: Header | None
    problem: str | None  # None: the file validates (or, from ``describe``, was not verified)
    best: float | None = None
    state_bytes: int = 0


def _open(ctx: ParallelContext | None, path: Path):
    import h5py

    from ..provenance import parallel_hdf5

    # Without MPI in h5py each rank reads the file on its own (reading needs no coordination).
    if ctx is not None and ctx.size > 1 and parallel_hdf5():
        return h5py.File(path, "r", driver="mpio", comm=ctx.comm_ctl)
    return h5py.File(path, "r")


def _complete_header(f, path: Path) -> Header:
    header = header_of(f.attrs, path)
    if not header.complete:
        raise CheckpointDamaged("the file was never completed")
    return header


def _damaged(error: BaseException) -> BaseException:
    """A sound file that does not fit stays a UsageError; anything else means the file is damaged
    (h5py reports truncation and the like as OSError or KeyError)."""
    return error if isinstance(error, (UsageError, CheckpointDamaged)) else CheckpointDamaged(oserror_text(error))


def _agreed(error: BaseException) -> BaseException:
    return error if isinstance(error, UsageError) else CheckpointDamaged(str(error))


def _agreed_path(ctx: ParallelContext, path: Path) -> Path:
    """``path``, the same file on every rank: parallel HDF5 opens it on all of them together, and
    a rank that cannot (another path, a node that does not see it) would leave the others waiting."""
    def check() -> Path:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"checkpoint '{p}' not found" + (f" on rank {ctx.rank} ({ctx.host})" if ctx.size > 1 else ""))
        return p

    return agreed(ctx, "the checkpoint's path", check, str)


def read_header(ctx: ParallelContext, path: Path) -> Header:
    """Collective. Raises CheckpointDamaged (on every rank) if the file cannot be trusted."""
    path = _agreed_path(ctx, path)
    header = None
    with collective_stage(ctx, convert=_agreed):
        try:
            with _open(ctx, path) as f:
                header = _complete_header(f, path)
        except Exception as e:  # noqa: BLE001
            raise _damaged(e) from None
    return header


def load(ctx: ParallelContext, path: Path, template: Any) -> Loaded:
    """Read and verify a checkpoint into a state shaped like ``template``. Collective.

    Every rank reads the whole state (it is replicated); each rank verifies the checksums of the
    blocks it would write, so verification is shared. Raises CheckpointDamaged on every rank for
    a file that cannot be trusted, and UsageError when the file is sound but holds a state of a
    different structure than this run's.
    """
    import jax

    path = _agreed_path(ctx, path)
    specs, treedef = template_leaves(template)
    result = None
    with collective_stage(ctx, convert=_agreed):
        try:
            with _open(ctx, path) as f:
                header = _complete_header(f, path)
                leaves = [_read_leaf(f, path, spec, (ctx.rank, ctx.size)) for spec in specs]
                history = _read_history(f, header.generation)
                result = Loaded(header, jax.tree_util.tree_unflatten(treedef, leaves), history)
        except Exception as e:  # noqa: BLE001
            raise _damaged(e) from None
    return result


def _read_leaf(f, path: Path, spec: tuple, share: tuple[int, int]):
    import jax

    name, shape, dtype, is_key = spec
    if name not in f:
        raise UsageError(f"checkpoint '{path}' has no dataset '{name}': it holds the state of a "
                         "different algorithm or hpcevo version than this run")
    d = f[name]
    if tuple(d.shape) != shape or np.dtype(d.dtype) != dtype:
        raise UsageError(f"checkpoint '{path}': dataset '{name}' is {d.dtype}{tuple(d.shape)}, this run "
                         f"needs {dtype}{shape}: it was written by a different configuration or version")
    arr = np.asarray(d[()]).reshape(shape)
    _verify(d, arr, share)
    if is_key:
        impl = str(d.attrs.get("prng_impl", ""))
        return jax.random.wrap_key_data(arr, impl=impl or None)
    return arr


def _read_history(f, generations: int) -> dict[str, np.ndarray]:
    history = {}
    for field in sorted(f.get("history", {})):
        d = f[f"history/{field}"]
        arr = np.asarray(d[()])
        _verify(d, arr)
        if arr.shape != (generations,):
            raise CheckpointDamaged(f"'{d.name}' has {arr.shape[0]} entries for {generations} generations")
        history[field] = arr
    return history


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
        if block_crc(arr, rows, b) != int(table[b]):
            what = "value" if not arr.shape else f"rows {b * rows}..{min(arr.shape[0], (b + 1) * rows) - 1}"
            raise CheckpointDamaged(f"checksum mismatch in '{d.name}' ({what})")


# -- one process, no MPI: for `hpcevo inspect`, `hpcevo.open_run` ---------------------------------
def describe(path: Path) -> Report:
    """The header of ``path`` on this process alone, without checking the data (cheap)."""
    return _report(Path(path), verify=False)


def verify_file(path: Path) -> Report:
    """Open ``path`` on this process alone and check everything: header, every checksum."""
    return _report(Path(path), verify=True)


def _report(path: Path, verify: bool) -> Report:
    report = Report(path, path.stat().st_size if path.exists() else 0, None, None)
    try:
        with _open(None, path) as f:
            report.header = _complete_header(f, path)
            if verify:
                _verify_all(f, report)
    except Exception as e:  # noqa: BLE001  (whatever h5py raises, the file is damaged)
        report.problem = str(_damaged(e))
    return report


def _verify_all(f, report: Report) -> None:
    import h5py

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
    elif "history/best" in f and f["history/best"].shape[0]:  # islands: the best of all of them
        report.best = float(f["history/best"][-1])


def read_history(path: Path) -> dict[str, np.ndarray]:
    """The per-generation history stored in a checkpoint (this process alone)."""
    with _open(None, path) as f:
        return {k: np.asarray(v[()]) for k, v in f["history"].items()}
