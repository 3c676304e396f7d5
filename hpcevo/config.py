"""Run configuration: TOML in, a typed and validated ``RunConfig`` out.

Every problem with the input becomes one ``ConfigError`` whose text names the file, the key,
what was given and what is allowed. Identical inputs give identical errors on every rank, which
is what lets the CLI report once and exit 2 everywhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from .errors import ConfigError


class _Section(BaseModel):
    # strict: TOML is typed, so "100" for an int is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RunSection(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    seed: int = Field(0, ge=0, lt=2**32)
    generations: int = Field(ge=1)
    out: str | None = None  # default: runs/<name>, relative to the working directory
    dtype: Literal["float32", "float64"] = "float32"


class AlgorithmSection(_Section):
    # The algorithm's own hyper-parameters ride along as extras and are checked against the
    # algorithm's dataclass, the single home of their defaults.
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    name: str
    pop_size: int = Field(ge=1)


class ProblemSection(_Section):
    name: str
    # Required by the classic and CEC functions; neuro derives it from the network, and a user's
    # problem may carry its own (see hpcevo/problems).
    dim: int | None = Field(None, ge=1)
    lb: float | list[float] | None = None
    ub: float | list[float] | None = None
    args: dict[str, Any] = Field(default_factory=dict)  # the problem's own arguments
    # Problems by import path: true = the function takes a block (n, dim), false = one candidate
    # (dim,), vectorised with vmap; unset = the function's own `batched` attribute, else its shapes.
    batched: bool | None = None
    # Multi-objective problems only: the number of objectives of the scalable ones (DTLZ,
    # default 3), and the hypervolume reference point (default: the problem's, its Pareto
    # front's nadir plus 10% of its extent; exact hypervolume for 2 and 3 objectives).
    objectives: int | None = Field(None, ge=2)
    ref_point: list[float] | None = None
    # true: the function named by import path is NumPy (or other non-JAX) code, evaluated on the
    # host outside JIT (see hpcevo/problems/host.py); name = "command" is always on the host.
    host: bool | None = None


class EvaluationSection(_Section):
    # Most rows one call of the problem function sees; a micro-batch with more rows is evaluated
    # in pieces, one after another, to bound device memory. 0 = a whole micro-batch per call.
    batch_size: int = Field(0, ge=0)
    # Host problems only (a NumPy function, an external command): evaluations running at the
    # same time on each rank (threads), how candidates are dealt to ranks ("static": fixed
    # blocks; "dynamic": each rank takes the next candidate when it is free, for evaluations
    # whose cost varies), and the fitness a failed evaluation gets (inf: the worst).
    concurrency: int = Field(1, ge=1)
    schedule: Literal["static", "dynamic"] = "static"
    penalty: float = math.inf

    @field_validator("penalty")
    @classmethod
    def _penalty_comparable(cls, v):
        if math.isnan(v):  # NaN would make every resume look like a changed penalty
            raise ValueError("must be a number or inf, not nan (inf: the worst fitness)")
        return v


# The [evaluation] keys that mean something for host problems only, with their defaults.
HOST_EVALUATION_KEYS = {"concurrency": 1, "schedule": "static", "penalty": math.inf}


class LogSection(_Section):
    every: int = Field(100, ge=1)
    progress: Literal["auto", "bar", "lines"] = "auto"


class ParallelSection(_Section):
    device: Literal["auto", "cpu", "gpu"] = "auto"
    # XLA CPU splits large reductions over its threads, so the thread count changes the last
    # bits of a result. A fixed default keeps runs bitwise equal at any rank count; "auto" (a
    # fair share of the node's cores) is faster on few ranks but only reproducible at the same
    # rank count.
    threads_per_rank: int | Literal["auto"] = 1
    # Rows per evaluation micro-batch; depends on the population size only, never on the rank
    # count (that is what keeps evaluation bitwise identical across rank counts). 0 = automatic.
    microbatch: int = Field(0, ge=0)
    # JAX's persistent compilation cache, so a second launch of the same config skips compiling:
    # "auto" = <run dir's parent>/.jax-cache, "off", or a directory. JAX_COMPILATION_CACHE_DIR in
    # the environment takes precedence.
    compile_cache: str = "auto"
    # One rank per GPU is the layout hpcevo binds; more ranks than GPUs on a node is refused
    # unless sharing them round-robin is asked for (see hpcevo/parallel/binding.py).
    share_gpus: bool = False


class CheckpointSection(_Section):
    # Periodic checkpoints guard against failures that come without warning (a node dies);
    # whichever of the two intervals comes first triggers one. 0 turns an interval off.
    every: int = Field(1000, ge=0)  # generations
    every_seconds: float = Field(900.0, ge=0)  # wall-clock seconds since the last checkpoint
    keep: int = Field(3, ge=1)  # newest checkpoints kept; older ones are pruned after a new one
    keep_every: int = Field(0, ge=0)  # also keep every checkpoint at a multiple of this generation
    dir: str | None = None  # default: <run dir>/checkpoints
    final: bool = True  # write one at the end of the run (what `run.generations += N` resumes)
    # Stop with a checkpoint (exit 75) before this: seconds from the start, a duration ("90m",
    # "01:30:00") or a local time ("2026-11-23T18:00"). A scheduler end time, when known, counts too.
    deadline: str | int | None = None
    margin_seconds: float = Field(60.0, ge=0)  # stop at least this long before the deadline
    # A collective HDF5 flush or close of a checkpoint still running after this long is taken as
    # stuck (a write failed on some ranks inside HDF5) and the job ends with exit code 4.
    stuck_seconds: float = Field(300.0, gt=0)

    @field_validator("deadline")
    @classmethod
    def _deadline_readable(cls, v):
        if v is not None:
            from .stopping import parse_deadline

            parse_deadline(v, 0.0)
        return v


class RunConfig(_Section):
    run: RunSection
    algorithm: AlgorithmSection
    problem: ProblemSection
    log: LogSection = LogSection()
    parallel: ParallelSection = ParallelSection()
    checkpoint: CheckpointSection = CheckpointSection()
    evaluation: EvaluationSection = EvaluationSection()

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out) if self.run.out else Path("runs") / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.out_dir / "checkpoints"

    @property
    def is_host(self) -> bool:
        """Whether the problem is evaluated on the host (NumPy function, external command)."""
        from .problems import is_host

        return is_host(self.problem.name, self.problem.host)

    @property
    def algorithm_params(self) -> dict[str, Any]:
        return dict(self.algorithm.model_extra or {})

    def to_dict(self) -> dict[str, Any]:
        """The resolved config: every default filled in, algorithm defaults included."""
        from .algorithms import ALGORITHMS

        d = self.model_dump(exclude_none=True)
        if not d["problem"].get("args"):
            d["problem"].pop("args", None)  # most problems take none
        if not self.is_host:
            for key in HOST_EVALUATION_KEYS:
                d["evaluation"].pop(key)
        algo_cls = ALGORITHMS[self.algorithm.name]
        for name, f in algo_cls.hyper_parameters().items():
            d["algorithm"].setdefault(name, f.default)
        return d


# --------------------------------------------------------------------------------------------
def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` with the value typed as TOML; a bare word is taken as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. --set run.generations=500")
    path, raw = text.split("=", 1)
    keys = path.strip().split(".")
    if not all(k.strip() for k in keys):
        raise ConfigError(f"--set {text!r}: empty key in {path!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [k.strip() for k in keys], value


def _apply_override(data: dict, keys: list[str], value: Any, text: str) -> None:
    node = data
    for i, k in enumerate(keys[:-1]):
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {text!r}: '{'.'.join(keys[: i + 1])}' is a value, not a table")
        node = nxt
    node[keys[-1]] = value


def _nearest(word: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else ""


def _format_validation(err: ValidationError, model: type[BaseModel], where: str, data: dict) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        # Union members show up as extra loc parts ("float", "list[float]"); they are noise.
        loc = [p for p in loc if p not in ("float", "list[float]", "int", "str", "none", "nullable[float]")]
        key = ".".join(loc)
        if e["type"] == "extra_forbidden":
            parent: Any = model
            for part in loc[:-1]:
                fld = parent.model_fields.get(part) if hasattr(parent, "model_fields") else None
                parent = fld.annotation if fld is not None else None
            valid = list(parent.model_fields) if parent is not None and hasattr(parent, "model_fields") else []
            what = "section" if len(loc) == 1 else "key"
            lines.append(f"unknown {what} '{key}'{_nearest(loc[-1], valid)} (valid: {', '.join(valid)})")
        elif e["type"] == "missing":
            parent_data: Any = data
            for part in loc[:-1]:
                parent_data = parent_data.get(part, {}) if isinstance(parent_data, dict) else {}
            given = list(parent_data) if isinstance(parent_data, dict) else []
            close = difflib.get_close_matches(loc[-1], given, n=1, cutoff=0.5)
            if close:  # most often a typo in the key's name, not a forgotten key
                prefix = ".".join(loc[:-1] + [close[0]])
                lines.append(f"unknown key '{prefix}'; did you mean '{loc[-1]}'? (required key '{key}' is missing)")
            else:
                lines.append(f"missing required key '{key}'")
        elif e["type"] == "value_error":  # our own validators' messages, kept as written
            lines.append(f"'{key}': {e['ctx']['error']}")
        else:
            lines.append(f"'{key}': {e['msg'].lower()}; got {e['input']!r}")
    return f"{where}: " + ("\n  ".join(lines) if len(lines) == 1 else "\n  " + "\n  ".join(lines))


def _check_algorithm(cfg: RunConfig, where: str) -> None:
    from .algorithms import ALGORITHMS

    name = cfg.algorithm.name
    if name not in ALGORITHMS:
        raise ConfigError(
            f"{where}: 'algorithm.name': unknown algorithm {name!r}{_nearest(name, ALGORITHMS)} "
            f"(available: {', '.join(sorted(ALGORITHMS))})"
        )
    cls = ALGORITHMS[name]
    fields = cls.hyper_parameters()
    for key, value in cfg.algorithm_params.items():
        if key not in fields:
            valid = ["name", "pop_size", *fields]
            raise ConfigError(
                f"{where}: unknown key 'algorithm.{key}' for {name}{_nearest(key, valid)} "
                f"(valid: {', '.join(valid)})"
            )
        try:
            TypeAdapter(_field_type(cls, fields[key]), config=ConfigDict(strict=True)).validate_python(value)
        except ValidationError as e:
            raise ConfigError(
                f"{where}: 'algorithm.{key}': {e.errors()[0]['msg'].lower()}; got {value!r}"
            ) from None


def _field_type(cls: type, f: dataclasses.Field) -> Any:
    return typing.get_type_hints(cls)[f.name]


def build_algorithm(cfg: RunConfig, problem, where: str = "config"):
    """The algorithm instance the config describes, with its own checks turned into ConfigError."""
    from .algorithms import ALGORITHMS, MultiObjectiveAlgorithm

    cls = ALGORITHMS[cfg.algorithm.name]
    objectives = getattr(problem, "num_objectives", 1)
    if cls.multi_objective != (objectives > 1):
        fits = ", ".join(n for n, c in sorted(ALGORITHMS.items()) if c.multi_objective == (objectives > 1))
        if objectives > 1:
            raise ConfigError(
                f"{where}: problem '{cfg.problem.name}' has {objectives} objectives, but algorithm "
                f"'{cfg.algorithm.name}' optimises one; multi-objective algorithms: {fits}"
            )
        raise ConfigError(
            f"{where}: algorithm '{cfg.algorithm.name}' is multi-objective, but problem "
            f"'{cfg.problem.name}' has 1 objective; single-objective algorithms: {fits}"
        )
    extra = {"num_objectives": objectives} if cls.multi_objective else {}
    if cfg.is_host and (objectives > 1 or cfg.algorithm_params.get("distributed")):
        raise ConfigError(f"{where}: [problem] {cfg.problem.name}: host problems run single-objective and "
                          "with the replicated population for now (no multi-objective algorithm, no "
                          "algorithm.distributed)")
    if cfg.algorithm_params.get("distributed"):
        for key, value in (("parallel.microbatch", cfg.parallel.microbatch),
                           ("evaluation.batch_size", cfg.evaluation.batch_size)):
            if value:
                raise ConfigError(f"{where}: '{key}' does not apply with algorithm.distributed = true: set "
                                  "algorithm.block (rows per block of the distributed step, which bounds "
                                  "memory the same way) instead")
    try:
        return cls(
            pop_size=cfg.algorithm.pop_size,
            dim=problem.dim,
            lb=problem.lb,
            ub=problem.ub,
            dtype=cfg.run.dtype,
            **extra,
            **cfg.algorithm_params,
        )
    except ValueError as e:
        raise ConfigError(f"{where}: [algorithm] {cfg.algorithm.name}: {e}") from None


def build_problem(cfg: RunConfig, where: str = "config"):
    """The problem instance; for problems by import path this imports and traces user code, so
    call it after ``parallel.bind`` (see ``problems.is_deferred``)."""
    from .problems import create

    p = cfg.problem
    try:
        problem = create(p.name, p.dim, p.lb, p.ub, p.args, p.batched, cfg.run.dtype, p.host, p.objectives)
    except ValueError as e:
        raise ConfigError(f"{where}: [problem]: {e}") from None
    if p.ref_point is not None:
        m = getattr(problem, "num_objectives", 1)
        if m == 1:
            raise ConfigError(f"{where}: 'problem.ref_point': {p.name} is single-objective; a hypervolume "
                              "reference point applies to multi-objective problems")
        if len(p.ref_point) != m or not all(math.isfinite(v) for v in p.ref_point):
            raise ConfigError(f"{where}: 'problem.ref_point': need {m} finite numbers (one per objective), "
                              f"got {p.ref_point}")
        if m > 3:
            raise ConfigError(f"{where}: 'problem.ref_point': exact hypervolume is computed for 2 and 3 "
                              f"objectives; {p.name} has {m} (IGD is still logged)")
    return problem


def build_recorder(cfg: RunConfig, problem):
    """What the run records: best-so-far for one objective; front, hypervolume (m <= 3) and IGD
    for several."""
    from .recording import MultiObjective, SingleObjective

    m = getattr(problem, "num_objectives", 1)
    if m == 1:
        return SingleObjective()
    # A user's multi-objective problem may know neither: then HV needs problem.ref_point, and
    # no IGD is logged.
    ref = cfg.problem.ref_point
    if ref is None and m <= 3 and hasattr(problem, "default_ref_point"):
        ref = problem.default_ref_point()
    front = problem.pareto_front() if hasattr(problem, "pareto_front") else None
    return MultiObjective(m, ref, front)


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> RunConfig:
    """Read, override, validate. Raises ConfigError with a message fit for the user."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' not found") from None
    except OSError as e:
        raise ConfigError(f"config file '{path}' cannot be read: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None
    return config_from_dict(data, where, overrides)


def config_from_dict(data: dict, where: str = "config", overrides: typing.Sequence[str] = ()) -> RunConfig:
    if overrides:
        where = f"{where} (with --set {' '.join(overrides)})"
    for text in overrides:
        keys, value = parse_override(text)
        _apply_override(data, keys, value, text)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, RunConfig, where, data)) from None
    _check_algorithm(cfg, where)
    if not cfg.is_host:
        for key, default in HOST_EVALUATION_KEYS.items():
            if getattr(cfg.evaluation, key) != default:
                raise ConfigError(
                    f"{where}: 'evaluation.{key}' applies to host problems only (a NumPy function "
                    f"with problem.host = true, or name = \"command\"); '{cfg.problem.name}' is "
                    "evaluated inside JAX"
                )
    from .problems import is_deferred

    if not is_deferred(cfg.problem.name):  # the others are checked when the run builds them
        build_algorithm(cfg, build_problem(cfg, where), where)  # runs the instances' own checks
    return cfg


# What a resumed run may not change: anything that changes the computation itself. The rest
# (run.generations, names and paths, logging, checkpoint settings, device and threads) may change.
RESUME_LOCKED = ("algorithm", "problem", "run.seed", "run.dtype", "parallel.microbatch", "evaluation.penalty")


def resume_conflicts(stored_text: str, cfg: RunConfig) -> list[str]:
    """Differences between a checkpoint's resolved config and ``cfg`` that forbid resuming it,
    one line each, naming the key and both values."""
    try:
        old = tomllib.loads(stored_text)
    except tomllib.TOMLDecodeError as e:
        return [f"the checkpoint's config cannot be read ({e})"]
    new = cfg.to_dict()
    missing = object()
    out = []
    for locked in RESUME_LOCKED:
        section, _, key = locked.partition(".")
        a, b = old.get(section, {}), new.get(section, {})
        keys = [key] if key else sorted(set(a) | set(b))
        for k in keys:
            va, vb = a.get(k, missing), b.get(k, missing)
            if va != vb:
                show = lambda v: "(not set)" if v is missing else repr(v)  # noqa: E731
                out.append(f"{section}.{k}: checkpoint has {show(va)}, this run has {show(vb)}")
    return out


def dump_config(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(cfg.to_dict())
