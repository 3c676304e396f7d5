"""From a config (and any objects held in Python) to the pieces of a run: problem, algorithm,
recorder, and the resolved config that records them. No MPI.

``check(cfg)`` is what ``hpcevo.load_config`` adds to the schema: the algorithm's name and
hyper-parameters, and for a built-in problem a dry build (cheap) that runs the problem's and the
algorithm's own checks. Problems named by import path and ``neuro`` import user code or an
environment library, which may touch JAX's backend: they are built when the run builds them,
after the rank is bound to its device.

Objects held in Python (``hpcevo.run(cfg, problem=f, algorithm=CSO(...))``) take the place of the
config's ``[problem]`` name and ``[algorithm]`` section; they go through the same checks, and the
resolved config records what they were (``resolved``).
"""

from __future__ import annotations

import math
import os
import stat
import typing
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..algorithms import ALGORITHMS
from ..algorithms.base import Algorithm
from ..algorithms.migration import Migration, unfit
from ..config import HOST_EVALUATION_KEYS, AlgorithmSection, RunConfig
from ..errors import ConfigError, did_you_mean
from ..problems import as_problem, create, is_deferred
from ..problems.base import HostProblem, Problem
from ..problems.user import held_name
from . import rules
from .recording import recorder_for
from .resources import check_memory

AnyProblem = typing.Union[Problem, HostProblem]


def check(cfg: RunConfig) -> AnyProblem | None:
    """Everything about ``cfg`` that can be checked without importing a user's code; the problem
    built to check it (None where it is the user's code, built on the ranks)."""
    problem = None
    if cfg.algorithm is not None:
        _check_algorithm_section(cfg)
        if cfg.problem.dim is not None and not cfg.algorithm_params.get("distributed"):
            # Before anything of size dim is built. (A distributed ES holds no population.)
            check_memory(cfg.source, pop_size(cfg, cfg.problem.dim), cfg.problem.dim, cfg.run.dtype)
    if cfg.islands is not None:
        island_sections(cfg)
    if cfg.problem.name is not None:
        _check_host_keys(cfg, cfg.is_host)
        if cfg.algorithm is not None and not is_deferred(cfg.problem.name):
            problem = build_problem(cfg)
            algorithm = build_algorithm(cfg, problem)  # runs the instances' own checks
            if cfg.islands is not None:
                build_islands(cfg, problem, algorithm)
            rules.check(cfg, problem)
    return problem


# -- the problem -------------------------------------------------------------------------------
def build_problem(cfg: RunConfig, held: Any = None, *, host: bool | None = None,
                  held_algorithm: Algorithm | None = None) -> AnyProblem:
    """The problem of ``cfg``, or ``held`` (a function or problem object) checked against it.

    ``host``: ``held`` is NumPy code, evaluated outside JAX (default: ``problem.host``).
    Problems by import path import and trace user code here: call it after ``parallel.bind``.
    """
    where, p = cfg.source, cfg.problem
    if held is not None:
        return _held_problem(cfg, held, p.host if host is None else host, held_algorithm)
    if p.name is None:
        raise ConfigError(f"{where}: missing required key 'problem.name' (a problem's name; from Python, "
                          "or pass problem= to hpcevo.run)", "problem.name")
    try:
        problem = create(p.name, p.dim, p.lb, p.ub, p.args, p.batched, cfg.run.dtype, p.host, p.objectives,
                         p.function, p.instance)
    except ValueError as e:
        raise ConfigError(f"{where}: [problem]: {e}", "problem") from None
    _check_ref_point(cfg, problem)
    return problem


def _held_problem(cfg: RunConfig, held: Any, host: bool | None, algorithm: Algorithm | None) -> AnyProblem:
    p = cfg.problem
    fit = isinstance(algorithm, Algorithm)  # (one that is not is refused with the algorithm's checks)
    fallback = (algorithm.dim, algorithm.lb, algorithm.ub) if fit else (None, None, None)
    try:
        problem = as_problem(held, p.dim, p.lb, p.ub, host=bool(host), batched=p.batched, dtype=cfg.run.dtype,
                             fallback=fallback)
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: problem=: {e}", "problem") from None
    _check_ref_point(cfg, problem)
    return problem


def _check_ref_point(cfg: RunConfig, problem: AnyProblem) -> None:
    p, where = cfg.problem, cfg.source
    if p.ref_point is None:
        return
    m = problem.num_objectives
    if m == 1:
        raise ConfigError(f"{where}: 'problem.ref_point': {problem.name} is single-objective; a hypervolume "
                          "reference point applies to multi-objective problems", "problem.ref_point")
    if len(p.ref_point) != m or not all(math.isfinite(v) for v in p.ref_point):
        raise ConfigError(f"{where}: 'problem.ref_point': need {m} finite numbers (one per objective), "
                          f"got {p.ref_point}", "problem.ref_point")
    if m > 3:
        raise ConfigError(f"{where}: 'problem.ref_point': exact hypervolume is computed for 2 and 3 "
                          f"objectives; {problem.name} has {m} (IGD is still logged)", "problem.ref_point")


def _check_host_keys(cfg: RunConfig, host: bool) -> None:
    if host:
        return
    for key, default in HOST_EVALUATION_KEYS.items():
        if getattr(cfg.evaluation, key) != default:
            raise ConfigError(
                f"{cfg.source}: 'evaluation.{key}' applies to host problems only (a NumPy function "
                f"with problem.host = true, or name = \"command\"); '{cfg.problem.name}' is "
                "evaluated inside JAX", f"evaluation.{key}")


# -- the algorithm -----------------------------------------------------------------------------
def _check_algorithm_section(cfg: RunConfig) -> None:
    where, name = cfg.source, cfg.algorithm.name
    if name not in ALGORITHMS:
        raise ConfigError(f"{where}: 'algorithm.name': unknown algorithm {name!r}{did_you_mean(name, ALGORITHMS, 0.5)} "
                          f"(available: {', '.join(sorted(ALGORITHMS))})", "algorithm.name")
    ALGORITHMS[name].check_parameters(cfg.algorithm_params, where, name)


def build_algorithm(cfg: RunConfig, problem: AnyProblem, held: Algorithm | None = None) -> Algorithm:
    """The algorithm ``cfg`` describes for ``problem`` (or ``held``, checked against both), with
    its own checks turned into ConfigError."""
    where = cfg.source
    _check_host_keys(cfg, problem.host)
    if held is not None:
        algorithm = _held_algorithm(cfg, problem, held)
        _check_fit(cfg, problem, type(algorithm), algorithm.distributed)
        if not algorithm.distributed:
            check_memory(where, algorithm.pop_size, problem.dim, cfg.run.dtype)
        return algorithm
    if cfg.algorithm is None:
        raise ConfigError(f"{where}: missing required key 'algorithm' (a section with name and pop_size; "
                          "from Python, or pass algorithm= to hpcevo.run)", "algorithm")
    _check_algorithm_section(cfg)
    cls = ALGORITHMS[cfg.algorithm.name]
    distributed = bool(cfg.algorithm_params.get("distributed"))
    _check_fit(cfg, problem, cls, distributed)
    pop = pop_size(cfg, problem.dim)
    if not distributed:
        check_memory(where, pop, problem.dim, cfg.run.dtype)
    extra = {"num_objectives": problem.num_objectives} if cls.multi_objective else {}
    try:
        return cls(pop_size=pop, dim=problem.dim, lb=problem.lb, ub=problem.ub,
                   dtype=cfg.run.dtype, **extra, **cfg.algorithm_params)
    except ValueError as e:
        key = getattr(e, "key", "")
        raise ConfigError(f"{where}: [algorithm] {cfg.algorithm.name}: {e}",
                          f"algorithm.{key}" if key and key in cls.hyper_parameters() else "algorithm") from None


def pop_size(cfg: RunConfig, dim: int) -> int:
    """The config's pop_size; where it gives none, the algorithm's own default for ``dim`` when
    it has one (CMA-ES: 4 + floor(3 ln n)), else the config's default."""
    cls = ALGORITHMS.get(cfg.algorithm.name)
    if "pop_size" in cfg.algorithm.model_fields_set or not hasattr(cls, "default_pop_size"):
        return cfg.algorithm.pop_size
    return cls.default_pop_size(dim, cfg.algorithm_params)


def _check_fit(cfg: RunConfig, problem: AnyProblem, cls: type, distributed: bool) -> None:
    """Whether an algorithm of class ``cls`` can run ``problem`` as ``cfg`` asks."""
    where, name = cfg.source, ALGORITHM_NAMES.get(cls, cls.__name__)
    objectives = problem.num_objectives
    if cls.multi_objective != (objectives > 1):
        fits = ", ".join(n for n, c in sorted(ALGORITHMS.items()) if c.multi_objective == (objectives > 1))
        if objectives > 1:
            raise ConfigError(f"{where}: problem '{problem.name}' has {objectives} objectives, but algorithm "
                              f"'{name}' optimises one; multi-objective algorithms: {fits}", "algorithm.name")
        raise ConfigError(f"{where}: algorithm '{name}' is multi-objective, but problem '{problem.name}' has "
                          f"1 objective; single-objective algorithms: {fits}", "algorithm.name")
    if problem.host and distributed:
        raise ConfigError(f"{where}: [problem] {problem.name}: host problems run single-objective and "
                          "with the replicated population for now (no multi-objective algorithm, no "
                          "algorithm.distributed)", "algorithm.distributed")
    if distributed:
        for key, value in (("parallel.microbatch", cfg.parallel.microbatch),
                           ("evaluation.batch_size", cfg.evaluation.batch_size)):
            if value:
                raise ConfigError(f"{where}: '{key}' does not apply with algorithm.distributed = true: set "
                                  "algorithm.block (rows per block of the distributed step, which bounds "
                                  "memory the same way) instead", key)


def _held_algorithm(cfg: RunConfig, problem: AnyProblem, held: Any) -> Algorithm:
    where = f"{cfg.source}: algorithm="
    if not isinstance(held, Algorithm):
        missing = [m for m in ("pop_size", "dim", "lb", "ub", "dtype", "distributed", "num_init", "num_ask",
                               "init", "ask", "tell", "init_ask", "init_tell", "population")
                   if not hasattr(held, m)]
        raise ConfigError(f"{where} {type(held).__name__} is not an hpcevo algorithm: it lacks "
                          f"{', '.join(missing)} (derive it from hpcevo.algorithms.BaseAlgorithm)", "algorithm")
    differs = [f"{what}: the algorithm has {mine!r}, the {whose} {theirs!r}"
               for what, mine, theirs, whose in (
                   ("dim", held.dim, problem.dim, "problem"),
                   ("lb", tuple(held.lb), problem.lb, "problem"),
                   ("ub", tuple(held.ub), problem.ub, "problem"),
                   ("dtype", held.dtype, cfg.run.dtype, "config's run.dtype"))
               if mine != theirs]
    if differs:
        raise ConfigError(f"{where} {type(held).__name__} was built for another problem:\n  " + "\n  ".join(differs)
                          + "\n  build it with the problem's dim, lb and ub (and run.dtype)", "algorithm")
    return held


ALGORITHM_NAMES = {cls: name for name, cls in ALGORITHMS.items()}


# -- islands -----------------------------------------------------------------------------------
def island_sections(cfg: RunConfig) -> list[dict[str, Any] | None]:
    """Each island's [algorithm] section where ``[[islands.island]]`` changes it (None: the
    run's own). An entry without ``at`` is for the island at its position in the list."""
    isl, where = cfg.islands, cfg.source
    out: list[dict[str, Any] | None] = [None] * isl.count
    for j, entry in enumerate(isl.island):
        at = entry.at if entry.at is not None else j
        for i in at if isinstance(at, list) else [at]:
            key = f"islands.island[{j}].at"
            if i >= isl.count:
                raise ConfigError(f"{where}: '{key}': island {i} does not exist (islands.count = {isl.count}: "
                                  f"islands 0..{isl.count - 1})", key)
            if out[i] is not None:
                raise ConfigError(f"{where}: '{key}': island {i} is changed by two [[islands.island]] entries", key)
            base = cfg.algorithm.model_dump() if cfg.algorithm is not None else {}
            name = entry.algorithm.get("name", base.get("name"))
            if name != base.get("name"):  # another algorithm: its own defaults, the run's pop_size
                base = {k: v for k, v in base.items() if k == "pop_size"}
            out[i] = {**base, **entry.algorithm, "name": name}
    return out


def build_islands(cfg: RunConfig, problem: AnyProblem, algorithm: Algorithm) -> tuple[list[Algorithm], list[str]]:
    """Every island's algorithm (``algorithm``, the run's, where no entry changes it) and name,
    checked for islands: each can take immigrants, and has room for them."""
    isl, where = cfg.islands, cfg.source
    base_name = cfg.algorithm.name if cfg.algorithm is not None else ALGORITHM_NAMES.get(type(algorithm), "algorithm")
    algorithms, names = [], []
    for i, section in enumerate(island_sections(cfg)):
        if section is None:
            algorithms.append(algorithm)
            names.append(base_name)
            continue
        try:
            island_cfg = cfg.model_copy(update={"algorithm": AlgorithmSection.model_validate(section)})
            algorithms.append(build_algorithm(island_cfg.with_source(where), problem))
        except (ConfigError, ValidationError) as e:
            raise ConfigError(f"island {i} ([[islands.island]]): {e}", "islands.island") from None
        names.append(section["name"])
    _check_islands(cfg, problem, algorithms)
    return algorithms, names


def migration(cfg: RunConfig) -> Migration:
    """The [islands] section's migration."""
    isl = cfg.islands
    return Migration(isl.migrate_every, isl.migrants, isl.topology, isl.emigrants, isl.replace)


def _check_islands(cfg: RunConfig, problem: AnyProblem, algorithms: list[Algorithm]) -> None:
    found = unfit(algorithms, migration(cfg), problem.host)
    if found is not None:
        raise ConfigError(f"{cfg.source}: [islands]: {found[1]}", found[0])


# -- what the run records ----------------------------------------------------------------------
def build_recorder(cfg: RunConfig, problem: AnyProblem):
    """Best-so-far for one objective; front, hypervolume (m <= 3) and IGD for several."""
    return recorder_for(problem, cfg.problem.ref_point)


def resolved(cfg: RunConfig, problem: AnyProblem | None = None, algorithm: Algorithm | None = None,
             held_problem: bool = False, held_algorithm: bool = False) -> dict[str, Any]:
    """The resolved config: every default filled in, the algorithm's too; objects held in Python
    recorded by name (``held_name``) and values."""
    d = cfg.model_dump(exclude_none=True)
    if not d["problem"].get("args"):
        d["problem"].pop("args", None)  # most problems take none
    host = problem.host if problem is not None else cfg.is_host
    if not host:
        for key in HOST_EVALUATION_KEYS:
            d["evaluation"].pop(key)
    if held_problem:
        d["problem"].update(name=problem.name, dim=problem.dim, **({"host": True} if problem.host else {}))
    if held_algorithm:
        d["algorithm"] = algorithm_section(algorithm)
    else:
        for name, f in ALGORITHMS[cfg.algorithm.name].hyper_parameters().items():
            if f.default is not None:  # (None: unset, e.g. x0; TOML has no null)
                d["algorithm"].setdefault(name, f.default)
        if algorithm is not None:  # pop_size as run: an algorithm's own default where none was given
            d["algorithm"]["pop_size"] = algorithm.pop_size
    return d


def algorithm_section(algorithm: Algorithm) -> dict[str, Any]:
    """An algorithm object as an [algorithm] section: its config name (or ``held_name``),
    pop_size and hyper-parameters."""
    cls = type(algorithm)
    out: dict[str, Any] = {"name": ALGORITHM_NAMES.get(cls, held_name(algorithm)), "pop_size": algorithm.pop_size}
    if hasattr(cls, "hyper_parameters"):
        for name in cls.hyper_parameters():
            if getattr(algorithm, name) is not None:
                out[name] = _plain(getattr(algorithm, name))
    return out


def _plain(value: Any) -> Any:
    """A value TOML can hold."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def dump(d: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(d)




def program_key(cfg: RunConfig) -> str:
    """What decides the pieces a run builds and the programs it compiles: the config but for
    the seed (data to the programs), how long and where it runs, how it logs and checkpoints."""
    import json

    d = cfg.model_dump()
    for key in ("seed", "name", "out", "generations", "reevaluate"):
        d["run"].pop(key, None)
    for section in ("log", "checkpoint"):
        d.pop(section, None)
    return json.dumps(d, sort_keys=True, default=repr)


# -- JAX, before the first computation ----------------------------------------------------------
def jax_mode(cfg: RunConfig):
    """The JAX mode a run computes in, for the run's duration (a context manager): 64-bit types
    on for float64 runs, off for float32 ones, whatever the process had on before. The mode
    changes the bits of a float32 run (integer draws are 64-bit with it on: DE, GA and JADE gave
    other digests), so a float32 run after a float64 one in the same process (a study's group,
    a script's loop) or in a script that turned it on for its own use is the run the command
    line makes alone. (Thread-local: the run's own thread computes in it.)"""
    import jax

    return jax.enable_x64(cfg.run.dtype == "float64")


# The caches hpcevo chooses are kept under this size, their least recently used entries deleted
# first, at most once an hour per cache (prune_compile_cache). JAX's own cap
# (jax_compilation_cache_max_size) is left off: it lists and reads every entry of the cache on
# each write, under a lock that every read waits for, so its cost grows with the cache (0.25 s a
# write at 3,000 entries on a 2-core machine; the test suite's cache made the suite's writes
# quadratic). Without it JAX neither locks nor scans; two processes writing one entry write the
# same bytes, and a read that meets a half-written entry is reported by JAX as a warning and
# compiled again. JAX_COMPILATION_CACHE_MAX_SIZE in the environment (or a cap set in Python
# before the run) is the user's choice: JAX's LRU then runs as asked and hpcevo prunes nothing.
COMPILE_CACHE_MAX_BYTES = 4 << 30
COMPILE_CACHE_PRUNE_SECONDS = 3600


def enable_compile_cache(cfg: RunConfig) -> tuple[str | None, str]:
    """Point JAX's persistent compilation cache at the configured directory (before the first
    compilation); the directory (None: off) and a note for the log ("" when there is none).

    A cache holds compiled programs that every later run loads and executes, so it must be a
    directory only this user can write: "auto" (``<run dir's parent>/.jax-cache``) is created
    with mode 0700 and used only if it is this user's and writable by no one else (a run
    directory under /tmp would otherwise share /tmp/.jax-cache); else the per-user cache
    (``$XDG_CACHE_HOME/hpcevo/jax-cache``, default ``~/.cache``) is used, else none. A directory
    named in the config that fails the check is refused. A directory already configured
    (JAX_COMPILATION_CACHE_DIR in the environment) is the environment's choice and kept as is."""
    import jax

    path, note = jax.config.jax_compilation_cache_dir, ""
    if not path:
        setting = cfg.parallel.compile_cache
        if setting == "off":
            return None, ""
        if setting == "auto":
            path, note = _auto_cache(cfg.out_dir.parent / ".jax-cache")
            if path is None:
                return None, note
        else:
            why = _private_dir(Path(setting))
            if why:
                raise ConfigError(f"{cfg.source}: 'parallel.compile_cache': '{setting}' {why}: a compilation cache "
                                  "holds programs that every run loads and executes; use a directory only you "
                                  "can write (or \"auto\", or \"off\")", "parallel.compile_cache")
            path = setting
        jax.config.update("jax_compilation_cache_dir", str(path))
    _cache_settings(Path(path))
    return str(path), note


def enable_api_compile_cache(setting: str | os.PathLike, face: str) -> str | None:
    """The persistent compilation cache for the research API (``Loop``, ``Archipelago``, built
    by a user's script): ``setting`` "auto" points JAX at the per-user cache
    (``$XDG_CACHE_HOME/hpcevo/jax-cache``) when it passes ``enable_compile_cache``'s check (none
    otherwise), a path at that directory (UsageError, naming ``face``'s argument, if it fails
    the check), "off" at none. A cache JAX already has (JAX_COMPILATION_CACHE_DIR, a run earlier
    in the process) is kept whatever the setting. The directory in use, or None. (Without it a
    script compiled its programs again at every launch: 11-16 s each, issue 41.)"""
    import jax

    from ..errors import UsageError

    if not isinstance(setting, (str, os.PathLike)):
        raise UsageError(f"{face}(compile_cache=...): \"auto\", \"off\" or a directory, got {type(setting).__name__}")
    path = jax.config.jax_compilation_cache_dir
    if not path:
        if setting == "off":
            return None
        if setting == "auto":
            path = user_cache_dir()
            if _private_dir(path):
                return None
        else:
            why = _private_dir(Path(setting))
            if why:
                raise UsageError(f"{face}(compile_cache='{setting}'): the directory {why}: a compilation cache "
                                 "holds programs that every run loads and executes; give a directory only you "
                                 "can write (or \"auto\", or \"off\")")
            path = setting
        jax.config.update("jax_compilation_cache_dir", str(path))
    _cache_settings(Path(path))
    return str(path)


def _cache_settings(path: Path) -> None:
    import jax

    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # Most of our programs compile in well under a second each, and together they are most
        # of a launch: JAX's default (skip those under 1 s) would cache almost none of them.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if jax.config.jax_compilation_cache_max_size < 0 and "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        prune_compile_cache(path)


def prune_compile_cache(path: Path, max_bytes: int = COMPILE_CACHE_MAX_BYTES,
                        every_seconds: float = COMPILE_CACHE_PRUNE_SECONDS) -> int:
    """Delete the least recently used entries of the compilation cache at ``path`` until it
    holds at most ``max_bytes``; the bytes freed. Done at most once per ``every_seconds`` per
    cache (the stamp file ``.hpcevo-pruned``, whose lock also keeps the ranks of a job and
    concurrent jobs from pruning at once: the others skip), so a launch pays a ``stat`` and, once
    an hour, one listing of the directory. "Used" is the entry's access or modification time,
    whichever is later (a ``relatime`` mount updates the access time once a day). Never fails a
    run: a cache that cannot be pruned is left as it is."""
    import fcntl
    import time

    stamp = path / ".hpcevo-pruned"
    try:
        if time.time() - stamp.stat().st_mtime < every_seconds:
            return 0
    except OSError:
        pass
    try:
        fd = os.open(stamp, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return 0
    freed = 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another process is pruning it now
        os.utime(fd)
        entries = []
        with os.scandir(path) as it:
            for e in it:
                # (JAX's entries, and hpcevo's programs kept on disk: driver/programs.py)
                if e.name.endswith(("-cache", ".program")) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((max(st.st_atime, st.st_mtime), e.path, st.st_size))
        total = sum(size for _, _, size in entries)
        for _, name, size in sorted(entries):
            if total <= max_bytes:
                break
            for victim in (name, name[: -len("-cache")] + "-atime") if name.endswith("-cache") else (name,):  # (JAX's LRU leaves -atime files)
                try:
                    os.unlink(victim)
                except FileNotFoundError:
                    pass
            total -= size
            freed += size
    except OSError:
        pass
    finally:
        os.close(fd)
    return freed


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpcevo" / "jax-cache"


def _auto_cache(beside_runs: Path) -> tuple[str | None, str]:
    why = _private_dir(beside_runs)
    if not why:
        return str(beside_runs), ""
    fallback = user_cache_dir()
    why_not = _private_dir(fallback)
    if not why_not:
        return str(fallback), f"note: compile cache '{beside_runs}' {why}; using '{fallback}' instead"
    return None, (f"note: no compile cache: '{beside_runs}' {why}, and '{fallback}' {why_not} "
                  "(set parallel.compile_cache to a directory only you can write)")


def _private_dir(path: Path) -> str:
    """"" when ``path`` is (or was just made, mode 0700) a directory of this user's that no one
    else can write, not a link; else why not, as the end of a sentence."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be created ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def probe_batch_size(cfg: RunConfig, problem: AnyProblem, algorithm: Algorithm, device: str = "cpu") -> bool | None:
    """With ``evaluation.batch_size`` below the micro-batch: does evaluating in pieces give the
    unchunked values bit for bit, on one micro-batch of random candidates? (None: no pieces.)

    A problem whose row values depend on its block's shape would otherwise change the run's last
    bits silently when a user bounds memory. Problems that are block invariant by construction
    say so (``block_invariant``: the numerical and CEC 2022 functions, tested bitwise); for the
    others the probe costs two compilations of the problem."""
    import jax
    import jax.numpy as jnp

    from ..parallel.evaluate import chunking_is_exact, microbatch_rows

    mb = microbatch_rows(algorithm.num_ask, cfg.parallel.microbatch or None, device)
    piece = cfg.evaluation.batch_size
    if not piece or piece >= mb or problem.host:  # host functions are not probed: they may be costly
        return None
    if problem.block_invariant:
        return True
    lb, ub = (jnp.asarray(b, algorithm.dtype) for b in (algorithm.lb, algorithm.ub))
    x = lb + (ub - lb) * jax.random.uniform(jax.random.PRNGKey(cfg.run.seed), (mb, algorithm.dim), algorithm.dtype)
    args = (jnp.asarray(1, jnp.int32),) if problem.wants_generation else ()
    return chunking_is_exact(problem.evaluate, x, piece, *args)
