"""The checkpoint format: file names, the header (root attributes), retention. No MPI.

A checkpoint file ``gen-000001000.h5`` holds:

    /             attributes: format, format_version, generation, evaluations (and num_init,
                  num_ask: evaluations in generation 1 and in each later one), seed, ranks (that
                  wrote it), created (UTC ISO time), hpcevo_version, versions (JSON), config (the
                  resolved run config, TOML), complete (written last)
    /state/...    one dataset per leaf of the run's state pytree, named by its pytree path
                  (``state/algo/position``), with the leaf's exact dtype and shape; PRNG keys too
                  (typed keys are stored as their key data plus a ``prng_impl`` attribute)
    /history/...  one value per generation so far, one dataset per series the run keeps
                  (``best``, ``gen_best``, ``gen_mean``, ``gen_std``, ``nonfinite`` for a
                  single-objective run: ``hpcevo.driver.recording``)

Every dataset carries ``crc32`` (one CRC-32 per block of ``crc_rows`` leading-axis rows,
``layout.py``) that loading verifies, so a flipped bit anywhere is found, not resumed from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointDamaged

FORMAT = "hpcevo-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^gen-(\d{9,})\.h5$")


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
    # The algorithm's dynamic hyper-parameters as they were (``Algorithm.dynamic``): a resumed
    # run continues with them, even where they were changed while it ran.
    params: dict[str, float] = dataclasses.field(default_factory=dict)


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
    hosts: tuple[str, ...] = ()  # the writers' hosts (MPI_Get_processor_name); () in older files
    params: dict[str, float] | None = None  # dynamic hyper-parameters; None in older files

    @property
    def writers(self) -> str:
        """'4 ranks on 2 hosts (node1, node2)', or '1 rank'."""
        text = f"{self.ranks} rank{'s' if self.ranks != 1 else ''}"
        if self.hosts:
            n = len(self.hosts)
            text += f" on {n} host{'s' if n != 1 else ''} ({', '.join(self.hosts)})"
        return text


def file_name(generation: int) -> str:
    return f"gen-{generation:09d}.h5"


def generation_of(path: Path) -> int:
    """The generation in a checkpoint's file name."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise ValueError(f"'{path}' is not named like a checkpoint (gen-NNNNNNNNN.h5)")
    return int(m.group(1))


def list_checkpoints(directory: Path) -> list[Path]:
    """Published checkpoints in ``directory``, newest (highest generation) first."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), n) for n in names if (m := _NAME.match(n))]
    return [Path(directory) / n for _, n in sorted(found, reverse=True)]


def partial_name(final: Path) -> Path:
    """Where a checkpoint is written before it is published under ``final``."""
    return final.parent / f".{final.name}.partial"


def list_partials(directory: Path) -> list[Path]:
    """Unfinished checkpoints (``.gen-*.partial``) left by a run that died mid-write."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(Path(directory) / n for n in names if n.startswith(".gen-") and n.endswith(".partial"))


def remove_partials(directory: Path) -> None:
    """Drop ``.partial`` files left by a run that died mid-write (one process)."""
    for path in list_partials(directory):
        try:
            path.unlink()
        except OSError:
            pass


def prune(directory: Path, *, keep: int, keep_every: int = 0, written: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (and those at multiples of ``keep_every``).

    ``written``, the checkpoint just written, always stays, and counts as one of the ``keep``: it
    is the state its writer holds now, even where the directory holds checkpoints of later
    generations (a loop loaded from an older checkpoint and saved again, another run's files, a
    damaged newest one that a resume passed over). Ranked by generation alone it was deleted
    the moment it was published, and ``Loop.save`` returned the path of a file that was gone."""
    removed: list[Path] = []
    try:
        listed = list_checkpoints(directory)
    except OSError:  # (retention is best effort: it never fails a checkpoint already published)
        return removed
    others = [p for p in listed if written is None or p.name != Path(written).name]
    for i, path in enumerate(others):
        gen = generation_of(path)
        if i < keep - (written is not None) or (keep_every and gen % keep_every == 0):
            continue
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass  # retention is best effort: a file we cannot delete costs only space
    return removed


def header_of(attrs: Any, path: Path) -> Header:
    """The header from a file's root attributes; CheckpointDamaged when it is not one of ours."""
    if attrs.get("format") != FORMAT:
        raise CheckpointDamaged(f"not an hpcevo checkpoint (format attribute {attrs.get('format')!r})")
    version = int(attrs.get("format_version", -1))
    if version != FORMAT_VERSION:
        raise CheckpointDamaged(
            f"checkpoint format version {version}; this hpcevo reads version {FORMAT_VERSION}")
    try:
        return Header(
            path=Path(path),
            generation=int(attrs["generation"]),
            evaluations=int(attrs["evaluations"]),
            seed=int(attrs["seed"]),
            ranks=int(attrs["ranks"]),
            created=str(attrs["created"]),
            hpcevo_version=str(attrs["hpcevo_version"]),
            versions=_json_attr(attrs, "versions"),
            config_text=str(attrs["config"]),
            complete=bool(attrs["complete"]),
            num_init=int(attrs["num_init"]),
            num_ask=int(attrs["num_ask"]),
            hosts=tuple(_json_attr(attrs, "hosts", "[]")),
            params=_params(_json_attr(attrs, "params", "null")),
        )
    except KeyError as e:
        raise CheckpointDamaged(f"attribute {e.args[0]!r} is missing") from None


def _params(value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) for k, v in value.items()):
        raise CheckpointDamaged("attribute 'params' is not a table of hyper-parameters and numbers")
    return {k: float(v) for k, v in value.items()}


def _json_attr(attrs: Any, name: str, default: str | None = None) -> Any:
    text = attrs[name] if default is None else attrs.get(name, default)
    try:
        return json.loads(text)
    except ValueError:
        raise CheckpointDamaged(f"attribute {name!r} is not valid JSON") from None


# What HDF5 and MPI-IO bury in their error stacks, in the words a user searches for.
_REASONS = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded",
            "Input/output error", "No such file or directory", "File exists", "Stale file handle")
# MPI-IO (ROMIO, in MPICH and Open MPI) words the same errors its own way: an MPI_File_open on a
# read-only mount fails with "Read-only file or filesystem name", not the OS's strerror.
_ROMIO_WORDS = {"read-only file or filesystem": "Read-only file system",
                "not enough space for file": "No space left on device",
                "quota exceeded for files": "Disk quota exceeded",
                "access denied to file": "Permission denied"}


def oserror_text(e: BaseException) -> str:
    """The reason behind an HDF5 or OS error, in a user's words."""
    text = str(e)
    lowered = text.lower()
    for reason in _REASONS:
        if reason.lower() in lowered:
            return reason
    for words, reason in _ROMIO_WORDS.items():
        if words in lowered:
            return reason
    if getattr(e, "strerror", None):
        return e.strerror
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__
