"""How a state becomes datasets, and how datasets are cut into blocks. Pure: no MPI, no HDF5.

Writing scales with ranks: each large dataset's rows are cut into fixed blocks of about
``Layout.block_bytes`` (a function of the shape only, never of the rank count), the blocks are
dealt out to ranks in contiguous runs (``parallel.shard_of``), and every rank writes and
checksums only its own blocks. Datasets under ``Layout.split_min_bytes`` are written once, by
rank 0. A block is also the unit of the CRC-32s stored with every dataset; a reader uses the
block size the writer recorded (``crc_rows``), so files stay readable whatever a later layout
picks.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np

from ..parallel.evaluate import shard_of


@dataclasses.dataclass(frozen=True)
class Layout:
    """Block sizes: a value the writer is given (tests hand in small ones)."""

    block_bytes: int = 8 << 20  # rows of about this size: the unit of checksums and of the split
    split_min_bytes: int = 1 << 20  # below this, rank 0 writes the whole dataset

    def block_rows(self, shape: tuple, itemsize: int) -> int:
        if not shape:
            return 0
        row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64))
        return max(1, self.block_bytes // max(1, row_bytes))

    def blocks(self, shape: tuple, itemsize: int) -> tuple[int, int]:
        """(rows per block, number of blocks); a 0-d array is one block of 0 rows."""
        rows = self.block_rows(shape, itemsize)
        if not shape:
            return 0, 1
        return rows, -(-shape[0] // rows) if shape[0] else 0

    def my_blocks(self, rank: int, size: int, shape: tuple, itemsize: int, nbytes: int) -> range:
        """The blocks ``rank`` of ``size`` writes and checksums."""
        _, nblocks = self.blocks(shape, itemsize)
        if not shape or nbytes < self.split_min_bytes or size == 1:
            return range(nblocks) if rank == 0 else range(0)
        first, count = shard_of(nblocks, 1, size, rank)
        return range(first, first + count)

    def crc(self, arr: np.ndarray, rows: int, block: int) -> int:
        """CRC-32 of block ``block`` of ``rows`` rows of ``arr`` (the whole value when 0-d)."""
        return block_crc(arr, rows, block)


def block_crc(arr: np.ndarray, rows: int, block: int) -> int:
    part = arr if not arr.shape else arr[block * rows : (block + 1) * rows]
    return zlib.crc32(memoryview(np.ascontiguousarray(part)).cast("B"))


def _key_name(entry: Any) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _dataset_name(path: tuple) -> str:
    return "state/" + "/".join(_key_name(p) for p in path) if path else "state/value"


def flatten_state(tree: Any) -> list[tuple[str, np.ndarray, str | None]]:
    """(dataset name, host array, PRNG impl name or None) for every leaf, in pytree order."""
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        impl = None
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):  # or a Python scalar
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        out.append((_dataset_name(path), np.asarray(leaf), impl))
    return out


def template_leaves(template: Any) -> tuple[list[tuple[str, tuple, np.dtype, bool]], Any]:
    """For a pytree of ShapeDtypeStructs: (name, shape, storage dtype, is key) per leaf, treedef."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, leaf)
            out.append((_dataset_name(path), tuple(data.shape), np.dtype(data.dtype), True))
        else:
            out.append((_dataset_name(path), tuple(leaf.shape), np.dtype(leaf.dtype), False))
    return out, treedef
