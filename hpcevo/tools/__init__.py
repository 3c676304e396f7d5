"""Offline tools, on one process with no MPI (safe on a login node): ``inspection`` (``hpcevo
inspect``, ``hpcevo plot``) and ``model`` (``hpcevo model``)."""
