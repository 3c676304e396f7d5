"""hpcevo: MPI-first evolutionary computation with JAX."""

__version__ = "0.1.0"
