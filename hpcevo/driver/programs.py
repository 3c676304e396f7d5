"""Compiled programs kept on disk by what they are made from: a launch that runs a program an
earlier launch compiled loads it, without tracing or lowering it again.

JAX's persistent compilation cache keys an executable by the lowered program (StableHLO), so
every launch still traces the Python that builds each program and lowers it to StableHLO before
it can look the executable up. For hpcevo's programs that is most of a short run's cost: a warm
study of 48 BBOB runs (24 functions, 5-D, BIPOP-CMA-ES, one rank) spent 46 of its 49 s in
``Loop.compile``, 37 s of them tracing and lowering, 9 s loading from JAX's cache (cProfile,
2026-11-28). Every ``hpcevo run`` and every test that starts a process pays it too.

Here a program is keyed by what determines it before it is traced: the pieces its engine is
made of, written out (``describe``: the algorithm's static settings, the problem, the options,
the recorder, the arguments' types), and everything of the process that can change a traced
program (hpcevo's source files, the versions of JAX, jaxlib, NumPy and Python, JAX's flags,
XLA_FLAGS, the CPU). A key that matches therefore names the same StableHLO, compiled by the
same XLA: the loaded executable is the one the run would have compiled, bit for bit
(tests/test_programs.py compares digests with the store on and off, across processes). The
pieces are the ones ``loop.device_engine`` already shares between the loops of one process.

What is kept, and what never is:
- Programs of one rank only (a run's, a study group's, a script's Loop): a program of several
  ranks holds its communicator (mpi4jax's custom calls), which belongs to the process that
  compiled it.
- Programs made of hpcevo's own pieces only: a user's function, a class or an object from
  outside hpcevo (``describe`` gives None) can change without its name changing.
- Programs whose only custom calls are LAPACK's (CMA-ES's eigendecomposition). jaxlib sets
  LAPACK's entry points up when it lowers a call to it; a program loaded without lowering finds
  them unset and crashes, so they are set up before such a program is loaded. Any other custom
  call (a host callback, MPI) is not kept.

The files live in the compilation cache's directory (a directory only this user can write: what
is loaded is executed), as ``hpcevo-<key>.program``: the cache's pruning (``build.py``) ages
them out with JAX's own entries, and JAX's own LRU (``JAX_COMPILATION_CACHE_MAX_SIZE``), which
reads an access-time file beside every ``*-cache`` entry, leaves them alone. ``HPCEVO_PROGRAM_CACHE=0`` turns the store off. A file that
cannot be read, or a program that fails to load, is compiled again and written anew.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import platform
import re
import sys
from pathlib import Path
from typing import Any, Callable

import jax

FORMAT = 1
SWITCH = "HPCEVO_PROGRAM_CACHE"
_ALLOWED_CALLS = re.compile(r"^lapack_")
_CALLS = re.compile(r"custom_call\s*@([A-Za-z0-9_.$-]+)")

_fingerprint: str | None = None
loaded = 0  # programs this process loaded from a store (a test's and a run's measure)
stored = 0


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def store_for(directory: str | os.PathLike | None) -> "ProgramStore | None":
    """The store in the compilation cache's ``directory`` (None: no cache, or the store is off)."""
    if not directory or not enabled():
        return None
    return ProgramStore(Path(directory))


def process_fingerprint() -> str:
    """What of this process can change a traced, lowered or compiled program."""
    global _fingerprint
    if _fingerprint is None:
        import jaxlib
        import numpy

        h = hashlib.sha256()
        root = Path(__file__).resolve().parents[1]
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        for part in (jax.__version__, getattr(jaxlib, "__version__", ""), numpy.__version__, sys.version,
                     platform.machine(), os.environ.get("XLA_FLAGS", ""), os.environ.get("HPCEVO_LOOPS", ""),
                     _cpu()):
            h.update(repr(part).encode())
        _fingerprint = h.hexdigest()
    return _fingerprint


def _cpu() -> str:
    """The CPU's model and features (XLA compiles for the host's): a store shared by nodes of
    another CPU (a home directory on a cluster) gives them other keys, never an executable built
    for instructions they lack."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    first = text.split("\n\n", 1)[0]
    keep = [line for line in first.splitlines() if line.split(":")[0].strip() in ("vendor_id", "model name", "flags")]
    return "\n".join(keep)


def _jax_flags() -> str:
    # Every flag, conservatively (a flag that changes nothing only costs a miss when it changes);
    # read at each key, since a run sets some of them (64-bit mode) for its duration.
    values = jax.config.values
    return repr(sorted((k, repr(v)) for k, v in values.items()))


class ProgramStore:
    def __init__(self, directory: Path):
        self.directory = directory

    def key(self, program_id: str, name: str, signature: Any) -> str:
        h = hashlib.sha256()
        for part in (FORMAT, process_fingerprint(), _jax_flags(), bool(jax.config.jax_enable_x64), program_id,
                     name, repr(signature), jax.devices()[0].platform):
            h.update(repr(part).encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def path(self, key: str) -> Path:
        return self.directory / f"hpcevo-{key}.program"

    def load(self, key: str) -> tuple[Any, dict] | None:
        """(the loaded executable, what was kept beside it), or None (absent, unreadable, or not
        loadable here: then it is written again after compiling)."""
        global loaded
        path = self.path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            entry = pickle.loads(blob)
            if entry.get("format") != FORMAT or entry.get("key") != key:
                return None
            if any(_ALLOWED_CALLS.match(c) for c in entry["calls"]):
                _lapack_ready()
            from jax.experimental import serialize_executable

            compiled = serialize_executable.deserialize_and_load(*entry["executable"])
        except Exception:  # noqa: BLE001 - a bad file is a miss: compiled again, written anew
            return None
        try:
            os.utime(path)  # (used: the pruning keeps the recently used)
        except OSError:
            pass
        loaded += 1
        return compiled, entry.get("extra", {})

    def save(self, key: str, lowered: Any, compiled: Any, extra: dict | None = None) -> bool:
        """Keep ``compiled`` (from ``lowered``) if it may be: no custom call but LAPACK's. Never
        fails the run: a store that cannot be written is left as it is."""
        global stored
        try:
            text = lowered.as_text()
            found = _CALLS.findall(text)
            calls = sorted(set(found))
            # (every custom call named, and each one LAPACK's: a call written another way than
            # the pattern reads is not kept either)
            if len(found) != text.count("custom_call") or any(not _ALLOWED_CALLS.match(c) for c in calls):
                return False
            from jax.experimental import serialize_executable

            entry = {"format": FORMAT, "key": key, "calls": calls, "extra": extra or {},
                     "executable": serialize_executable.serialize(compiled)}
            with io.BytesIO() as buf:
                pickle.dump(entry, buf, protocol=pickle.HIGHEST_PROTOCOL)
                blob = buf.getvalue()
            path = self.path(key)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except Exception:  # noqa: BLE001 - (a full disk, an executable that cannot be serialised)
            return False
        stored += 1
        return True

    def obtain(self, key: str, lower: Callable[[], Any], extra: Callable[[], dict] | None = None
               ) -> tuple[Any, dict, bool]:
        """(the executable, what was kept beside it, whether it was loaded): loaded from the store,
        else lowered, compiled and kept."""
        got = self.load(key)
        if got is not None:
            return got[0], got[1], True
        lowered = lower()
        hits = _cache_hits[0]
        with _fresh():
            # A compiler option at its default value: no other code, but another key for JAX's
            # in-process compilation cache, which may hold this program loaded from JAX's cache
            # (this process ran it before through jit), which could not be kept.
            compiled = lowered.compile(compiler_options=FRESH_OPTIONS)
        kept = extra() if extra is not None else {}
        if _cache_hits[0] == hits:
            self.save(key, lowered, compiled, kept)
        return compiled, kept, False


# An executable JAX loaded from its own persistent cache cannot be serialised again: XLA's CPU
# client keeps no object code for it, and one loaded back from such bytes fails at its first
# call ("Function ... not found"). So a program the store does not hold is compiled by XLA,
# not taken from JAX's cache (once per program: the store holds it next time), and one that
# came from JAX's cache all the same (counted below) is used but not kept.
_cache_hits = [0]
FRESH_OPTIONS = {"xla_dump_hlo_as_text": False}


def _count_hits(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _cache_hits[0] += 1


jax.monitoring.register_event_listener(_count_hits)


class _fresh:
    """JAX's persistent cache off for one compile (``reset_cache``: JAX decides whether to use
    it once, at its first compile, and again after a reset). Process-wide while it lasts: a
    thread compiling beside it then compiles without JAX's cache too (slower, never wrong)."""

    def __enter__(self) -> None:
        from jax.experimental.compilation_cache import compilation_cache as cc

        self.was = bool(jax.config.jax_enable_compilation_cache)
        jax.config.update("jax_enable_compilation_cache", False)
        cc.reset_cache()

    def __exit__(self, *exc: Any) -> None:
        from jax.experimental.compilation_cache import compilation_cache as cc

        jax.config.update("jax_enable_compilation_cache", self.was)
        cc.reset_cache()


def describe(value: Any) -> str | None:
    """``value`` as text that determines it, for a program id; None where it holds anything this
    cannot vouch for: code outside hpcevo (a user's function, a gymnax environment), an object
    of a class outside hpcevo, or one not made of plain values. Arrays by their dtype, shape and
    bytes; hpcevo's classes, functions and dataclasses by name and fields (their code is in the
    process fingerprint)."""
    import dataclasses
    import functools
    import types

    import numpy as np

    def ours(obj: Any) -> bool:
        return (getattr(obj, "__module__", "") or "").split(".")[0] == "hpcevo"

    def go(v: Any, depth: int) -> str | None:
        if depth > 12:
            return None
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            return f"{type(v).__name__}:{v!r}"
        if isinstance(v, (np.ndarray, np.generic, jax.Array)):
            a = np.asarray(v)
            if a.dtype == object:
                return None
            return f"array:{a.dtype.str}:{a.shape}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}"
        if isinstance(v, np.dtype):
            return f"dtype:{v.str}"
        if isinstance(v, (tuple, list, frozenset, set)):
            items = [go(x, depth + 1) for x in v]
            if any(x is None for x in items):
                return None
            if isinstance(v, (set, frozenset)):
                items = sorted(items)  # type: ignore[arg-type]
            return f"{type(v).__name__}({','.join(items)})"  # type: ignore[arg-type]
        if isinstance(v, dict):
            pairs = [(go(k, depth + 1), go(x, depth + 1)) for k, x in v.items()]
            if any(k is None or x is None for k, x in pairs):
                return None
            return "dict(" + ",".join(sorted(f"{k}={x}" for k, x in pairs)) + ")"  # type: ignore[str-bytes-safe]
        if isinstance(v, type):
            return f"type:{v.__module__}.{v.__qualname__}" if ours(v) else None
        if isinstance(v, functools.partial):
            parts = [go(v.func, depth + 1), go(v.args, depth + 1), go(v.keywords, depth + 1)]
            return None if None in parts else f"partial({','.join(parts)})"  # type: ignore[arg-type]
        if isinstance(v, types.MethodType):
            owner = go(v.__self__, depth + 1)
            return None if owner is None or not ours(v.__func__) else f"method:{v.__func__.__qualname__}:{owner}"
        if isinstance(v, types.FunctionType):
            if not ours(v) or "<locals>" in v.__qualname__ and v.__closure__:
                return None
            return f"function:{v.__module__}.{v.__qualname__}"
        if dataclasses.is_dataclass(v) and ours(type(v)):
            fields = [(f.name, go(getattr(v, f.name, None), depth + 1)) for f in dataclasses.fields(v)]
            if any(x is None for _, x in fields):
                return None
            return f"{type(v).__module__}.{type(v).__qualname__}(" + ",".join(f"{n}={x}" for n, x in fields) + ")"
        if isinstance(v, tuple) and hasattr(v, "_fields") and ours(type(v)):  # (a NamedTuple of ours)
            return go(tuple(v), depth + 1)
        return None

    return go(value, 0)


def _lapack_ready() -> None:
    """Set LAPACK's entry points up, as lowering a call to it does (jaxlib.lapack)."""
    import numpy as np
    from jaxlib import lapack

    lapack.prepare_lapack_call("syevd_ffi", np.dtype(np.float32))
