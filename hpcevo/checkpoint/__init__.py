"""Checkpoints: one HDF5 file per checkpoint, written by all ranks together (parallel HDF5).

The only package that touches HDF5. ``format`` (names, header, retention), ``layout`` (pure:
states as datasets, datasets as blocks), ``write`` (collective, atomic publish, failures on some
ranks only), ``read`` (collective load; one-process inspection). Every public function that
takes a ``ctx`` is collective over its ranks.
"""

from .format import (
    FORMAT,
    FORMAT_VERSION,
    CheckpointDamaged,
    Header,
    Snapshot,
    file_name,
    generation_of,
    list_checkpoints,
    list_partials,
    prune,
    remove_partials,
)
from .layout import Layout
from .read import Loaded, Report, describe, load, read_header, read_history, verify_file
from .write import serial_note, write

__all__ = [
    "FORMAT", "FORMAT_VERSION", "CheckpointDamaged", "Header", "Layout", "Loaded", "Report", "Snapshot",
    "describe", "file_name", "generation_of", "list_checkpoints", "list_partials", "load", "prune",
    "read_header", "read_history", "remove_partials", "serial_note", "verify_file", "write",
]
