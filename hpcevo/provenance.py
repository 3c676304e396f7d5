"""What produced a run: the versions of hpcevo and of the stack under it.

A leaf: the run driver, the checkpoint writer and ``hpcevo info`` all record these, and none of
them should have to import another to do so.
"""

from __future__ import annotations

import platform

from . import __version__


def versions() -> dict[str, str]:
    """hpcevo, Python, JAX, mpi4jax, mpi4py, h5py, HDF5 and the MPI library, by name."""
    import h5py
    import jax
    import jaxlib
    import mpi4jax
    import mpi4py

    from .parallel import mpi_library

    return {
        "hpcevo": __version__,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "mpi4jax": mpi4jax.__version__,
        "mpi4py": mpi4py.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": mpi_library()[0],
    }


def parallel_hdf5() -> bool:
    """Whether h5py was built with MPI (parallel checkpoints need it)."""
    import h5py

    return bool(h5py.get_config().mpi)
