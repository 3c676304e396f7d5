"""Run configuration: TOML in, a typed ``RunConfig`` out. The schema, overrides and messages.

Every problem with the input becomes one ``ConfigError`` whose text names the file, the key,
what was given and what is allowed. Identical inputs give identical errors on every rank, which
is what lets the CLI report once and exit 2 everywhere.

This module checks what the schema says (sections, keys, types, ranges) and builds nothing:
whether the named algorithm and problem exist and accept the values is checked where they are
built (``hpcevo.driver.build``); ``hpcevo.load_config`` does both.
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from . import schema
from .errors import ConfigError, did_you_mean
from .schema import INT32_MAX
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# A config needs only what has no sensible default: which algorithm, which problem (and its dim).
DEFAULT_GENERATIONS = 100
DEFAULT_POP_SIZE = 100
FLOAT32_MAX = 3.4028234663852886e38


class _Section(BaseModel):
    # strict: TOML is typed, so "100" for an int is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RunSection(_Section):
    # Default (filled in by config_from_dict): the config file's name, else "<algorithm>-<problem>".
    name: str = Field(pattern=NAME_PATTERN, max_length=128)
    seed: schema.Seed = 0
    generations: schema.Generations = DEFAULT_GENERATIONS
    out: str | None = None  # default: runs/<name>, relative to the working directory
    dtype: schema.DType = "float32"
    # Noisy problems: the best is evaluated this many times more, on draws no generation used,
    # and their mean reported as the best (0: the best as seen). Changes the report, not the run.
    reevaluate: schema.Reevaluations = 0
    # An evaluation budget: the run ends after the generation in which its evaluations (the rows
    # the algorithm uses) reach this many. Without run.generations, generations do not limit it.
    evaluations: Annotated[int, Field(ge=1)] | None = None
    # A target fitness: the run ends at the generation whose best so far is <= this
    # (single-objective). Both are checked after every generation, inside the compiled loop.
    target: float | None = None
    # The same relative to the problem's optimal value, where it is known (BBOB, CEC 2022, the
    # classic functions): the run ends when best - f_opt <= this (COCO's final target: 1e-8).
    target_precision: Annotated[float, Field(ge=0)] | None = None
    # Stagnation: the run ends at the generation whose best so far has improved by no more than
    # stagnation_tolerance over the last stagnation_generations generations (single-objective).
    stagnation_generations: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    stagnation_tolerance: float = Field(0.0, ge=0)


class AlgorithmSection(_Section):
    # The algorithm's own hyper-parameters ride along as extras and are checked against the
    # algorithm's dataclass, the single home of their defaults.
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    name: str
    pop_size: schema.PopSize = DEFAULT_POP_SIZE  # what fits in memory is checked at start-up


class ProblemSection(_Section):
    # Required unless a problem object is handed to hpcevo.run (checked where it is built).
    name: str | None = None
    # Required by the classic and CEC functions; neuro derives it from the network, and a user's
    # problem may carry its own (see hpcevo/problems).
    dim: schema.Dim | None = None
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
    # name = "bbob": which of COCO's 24 noiseless functions (1-24) and which instance (1, 2...;
    # COCO's instance numbers: its x_opt, f_opt, rotations).
    function: int | None = Field(None, ge=1, le=24)
    instance: int | None = Field(None, ge=1)


class EvaluationSection(_Section):
    # Most rows one call of the problem function sees; a micro-batch with more rows is evaluated
    # in pieces, one after another, to bound device memory. 0 = a whole micro-batch per call.
    batch_size: schema.BatchSize = 0
    # Host problems only (a NumPy function, an external command): evaluations running at the
    # same time on each rank (threads), how candidates are dealt to ranks ("static": fixed
    # blocks; "dynamic": each rank takes the next candidate when it is free, for evaluations
    # whose cost varies), and the fitness a failed evaluation gets (inf: the worst).
    concurrency: schema.Concurrency = 1
    schedule: schema.Schedule = "static"
    penalty: schema.Penalty = math.inf


# The [evaluation] keys that mean something for host problems only, with their defaults.
HOST_EVALUATION_KEYS = {"concurrency": 1, "schedule": "static", "penalty": math.inf}


class LogSection(_Section):
    every: int = Field(100, ge=1)
    progress: schema.Progress = "auto"
    # BBOB problems: write COCO's bbob data (every evaluation the algorithm used) into
    # <run dir>/coco, which COCO's post-processor reads: python -m cocopp <run dir>/coco
    coco: bool = False


class ParallelSection(_Section):
    device: schema.Device = "auto"
    # XLA CPU splits large reductions over its threads, so the thread count changes the last
    # bits of a result. A fixed default keeps runs bitwise equal at any rank count; "auto" (a
    # fair share of the node's cores) is faster on few ranks but only reproducible at the same
    # rank count.
    threads_per_rank: schema.Threads = 1
    # Rows per evaluation micro-batch; depends on the population size only, never on the rank
    # count (that is what keeps evaluation bitwise identical across rank counts). 0 = automatic.
    microbatch: schema.Microbatch = 0
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
    every: int = Field(1000, ge=0)  # generations (left at this default: at most 5% of the run, execute.py)
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
            parse_deadline(v, 0.0)
        return v


class FaultSection(_Section):
    # A watchdog on every rank ends the job (exit code 76) when a phase of the run takes far
    # longer than it should: that is how a rank that stopped answering (its node died) shows
    # itself to the others, which would otherwise wait inside a collective until the scheduler
    # notices (5.5 minutes with Slurm's defaults). Runs with more than one rank only.
    watchdog: bool = True
    # A dispatch of generations, or the boundary work after one, may take `slowdown` times the
    # slowest of the recent ones (so a run that slows down gradually is never ended), and
    # never less than min_seconds: about the time a lost node takes to be noticed.
    slowdown: float = Field(10.0, ge=2)
    min_seconds: float = Field(30.0, gt=0)
    # Fixed allowances: start-up (building, reading the checkpoint to resume from); compiling
    # with the first generation (ranks still compiling keep the others waiting there); a
    # checkpoint write (or slowdown x the slowest one written, if longer).
    startup_seconds: float = Field(600.0, gt=0)
    compile_seconds: float = Field(1800.0, gt=0)
    checkpoint_seconds: float = Field(600.0, gt=0)
    # How often each rank tells rank 0 (and a deputy on another host) it is alive, by UDP: what
    # lets the watchdog's message name the ranks and hosts that stopped answering.
    heartbeat_seconds: float = Field(2.0, gt=0, le=60)


class IslandOverride(_Section):
    # Which islands this entry changes (0-based; default: the entry's own position in the list)
    # and the [algorithm] keys it sets for them. A new algorithm name starts from that
    # algorithm's defaults (and the run's pop_size); the same name keeps the run's
    # hyper-parameters and changes the ones given.
    at: list[Annotated[int, Field(ge=0)]] | Annotated[int, Field(ge=0)] | None = None
    algorithm: dict[str, Any] = Field(default_factory=dict)


class IslandsSection(_Section):
    # Several populations (islands), each its own seed; every migrate_every generations each
    # sends `migrants` candidates along the topology. Deterministic at any layout on ranks.
    count: schema.IslandCount = 1
    migrate_every: schema.MigrateEvery = 50
    migrants: schema.Migrants = 1
    topology: schema.Topology = "ring"
    emigrants: schema.Emigrants = "best"
    replace: schema.Replace = "worst"
    island: list[IslandOverride] = Field(default_factory=list)


class RunConfig(_Section):
    run: RunSection
    # Required unless an algorithm object is handed to hpcevo.run (checked where it is built).
    algorithm: AlgorithmSection | None = None
    problem: ProblemSection = ProblemSection()
    log: LogSection = LogSection()
    parallel: ParallelSection = ParallelSection()
    checkpoint: CheckpointSection = CheckpointSection()
    evaluation: EvaluationSection = EvaluationSection()
    islands: IslandsSection | None = None
    fault: FaultSection = FaultSection()
    # Where it came from ("examples/cso.toml (with --set ...)"): the prefix of every message.
    _source: str = PrivateAttr(default="config")

    @property
    def source(self) -> str:
        return self._source

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out) if self.run.out else Path("runs") / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.out_dir / "checkpoints"

    @property
    def is_host(self) -> bool:
        """Whether the problem is evaluated on the host (NumPy function, external command)."""
        return self.problem.name == "command" or bool(self.problem.host)

    @property
    def algorithm_params(self) -> dict[str, Any]:
        """The [algorithm] keys beyond name and pop_size: the algorithm's own hyper-parameters."""
        return dict(self.algorithm.model_extra or {}) if self.algorithm is not None else {}

    def with_source(self, source: str) -> "RunConfig":
        self._source = source
        return self


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


def apply_overrides(data: dict, overrides: typing.Sequence[str]) -> dict:
    """``data`` (a TOML document's tables, changed in place) after the ``--set`` ``overrides``."""
    for text in overrides:
        keys, value = parse_override(text)
        _apply_override(data, keys, value, text)
    return data


def peek_startup_seconds(path: str | Path, overrides: typing.Sequence[str] = ()) -> float | None:
    """``fault.startup_seconds`` as the config file ``path`` with ``overrides`` sets it, read
    before MPI starts (the start-up guard's limit), or None: best effort, never an error (the
    config is read and checked properly later)."""
    try:
        data = apply_overrides(tomllib.loads(Path(path).read_text()), overrides)
        value = data.get("fault", {}).get("startup_seconds")
    except Exception:  # noqa: BLE001 - anything wrong here is reported by the real reading
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _apply_override(data: dict, keys: list[str], value: Any, text: str) -> None:
    node = data
    for i, k in enumerate(keys[:-1]):
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {text!r}: '{'.'.join(keys[: i + 1])}' is a value, not a table")
        node = nxt
    node[keys[-1]] = value


def _format_validation(err: ValidationError, model: type[BaseModel], where: str, data: dict) -> ConfigError:
    lines, keys = [], []
    for e in err.errors():
        loc = [p for p in e["loc"] if not schema.is_union_tag(p)]
        key = schema.key_of(tuple(loc))
        if e["type"] == "extra_forbidden":
            keys.append(key)
            parent = _model_at(model, loc[:-1])
            valid = list(parent.model_fields) if parent is not None else []
            what = "section" if len(loc) == 1 else "key"
            lines.append(f"unknown {what} '{key}'{did_you_mean(loc[-1], valid, 0.5)} (valid: {', '.join(valid)})")
        elif e["type"] == "missing":
            keys.append(key)
            parent_data: Any = data
            for part in loc[:-1]:
                parent_data = _child(parent_data, part)
            given = list(parent_data) if isinstance(parent_data, dict) else []
            close = difflib.get_close_matches(str(loc[-1]), given, n=1, cutoff=0.5)
            if close:  # most often a typo in the key's name, not a forgotten key
                prefix = schema.key_of((*loc[:-1], close[0]))
                lines.append(f"unknown key '{prefix}'; did you mean '{loc[-1]}'? (required key '{key}' is missing)")
            else:
                lines.append(f"missing required key '{key}'")
    for key, line in schema.messages(err.errors(), skip={"extra_forbidden", "missing"}):
        keys.append(key)
        lines.append(line)
    text = f"{where}: " + ("\n  ".join(lines) if len(lines) == 1 else "\n  " + "\n  ".join(lines))
    return ConfigError(text, keys[0] if len(set(keys)) == 1 else "")


def _model_at(model: Any, loc: list) -> type[BaseModel] | None:
    """The section (model) at ``loc`` in ``model``: through optional sections and lists of tables."""
    for part in loc:
        if isinstance(part, int):
            continue  # an entry of a list of tables: the list's item type is already in hand
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return None
        model = _section_type(fields[part].annotation)
    return model if hasattr(model, "model_fields") else None


def _section_type(annotation: Any) -> Any:
    """The model inside ``X | None`` or ``list[X]`` (the annotation itself when it is one)."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def _child(node: Any, part: Any) -> Any:
    if isinstance(part, int):
        return node[part] if isinstance(node, list) and 0 <= part < len(node) else {}
    return node.get(part, {}) if isinstance(node, dict) else {}


def read_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> RunConfig:
    """Read a TOML file, apply ``--set`` overrides, check the schema. Raises ConfigError with a
    message fit for the user."""
    path = Path(path)
    return config_from_dict(read_toml(path), str(path), overrides, default_name=path.stem)


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """A TOML file's data; ConfigError naming ``what`` and the path when it cannot be read (missing,
    a directory, not UTF-8, not TOML)."""
    path = Path(path)
    where = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} '{path}' not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} '{path}' is a directory, not a TOML file") from None
    except OSError as e:
        raise ConfigError(f"{what} '{path}' cannot be read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); "
                          "TOML files are UTF-8: save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None


def config_from_dict(data: dict, where: str = "config", overrides: typing.Sequence[str] = (),
                     default_name: str | None = None) -> RunConfig:
    """The schema's view of ``data`` (a TOML document as a dict) after ``overrides``; builds
    nothing (see the module docstring). ``default_name``: run.name when the config has none
    (default: "<algorithm>-<problem>")."""
    data = _copy(data)
    if overrides:
        where = f"{where} (with --set {' '.join(overrides)})"
    apply_overrides(data, overrides)
    _default_name(data, default_name)
    _budget_defaults(data)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise _format_validation(e, RunConfig, where, data) from None
    _check_bounds(cfg, where)
    return cfg.with_source(where)


def _budget_defaults(data: dict) -> None:
    run, problem = data.get("run"), data.get("problem")
    if not isinstance(run, dict):
        return
    budget = run.get("evaluations")
    if "generations" not in run and isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:
        # Every generation uses at least one evaluation: the budget bounds the generations.
        run["generations"] = min(budget, schema.INT32_MAX)
    if isinstance(problem, dict) and problem.get("name") == "bbob" and "dtype" not in run:
        # BBOB's optima lie away from zero and its targets reach f - f_opt = 1e-8, with f_opt of
        # order 100: float32 cannot even represent such differences there (its spacing at 100 is
        # 7.6e-6).
        run["dtype"] = "float64"


def _default_name(data: dict, name: str | None) -> None:
    run = data.setdefault("run", {})
    if not isinstance(run, dict) or "name" in run:
        return  # a [run] that is not a table is the schema's to report
    if name is None:
        parts = [(data.get(k) or {}).get("name") if isinstance(data.get(k), dict) else None
                 for k in ("algorithm", "problem")]
        name = "-".join(p.rsplit(":", 1)[-1] for p in parts if isinstance(p, str)) or "run"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:128] or "run"
    run["name"] = name


def _check_bounds(cfg: RunConfig, where: str) -> None:
    """Bounds must be numbers the run's dtype can hold: inf or a float64 beyond float32's range
    would turn every candidate of a float32 run into inf."""
    limit, dtype = (FLOAT32_MAX, "float32") if cfg.run.dtype == "float32" else (math.inf, "float64")
    for key in ("lb", "ub"):
        value = getattr(cfg.problem, key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        bad = [v for v in values if not math.isfinite(v) or abs(v) > limit]
        if bad:
            hint = " (run.dtype = \"float64\" holds up to 1.8e308)" if dtype == "float32" and all(
                math.isfinite(v) for v in bad) else ""
            raise ConfigError(f"{where}: 'problem.{key}': {bad[0]!r} is outside what {dtype} holds: bounds must be "
                              f"finite numbers within +-{limit:.4g}{hint}", f"problem.{key}")


def _copy(data: Any) -> Any:
    """A deep copy of nested dicts and lists (overrides must not change the caller's dict), with
    NumPy scalars as the Python numbers they hold and tuples as lists (a dict built in Python
    holds what a TOML document would)."""
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_copy(v) for v in data]
    return schema.plain(data)


# -- time values: checkpoint.deadline and the CLI's --deadline ---------------------------------
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(value: str | int | float, now: float) -> float:
    """A deadline as an epoch time. Accepts seconds from now (``5400``), a duration (``90m``,
    ``1.5h``, ``01:30:00``, ``1-06:00:00`` as Slurm writes days), or an absolute local time in ISO
    form (``2026-11-23T18:00``, with or without a UTC offset), or an epoch time (``@1795000000``).
    Raises ValueError saying what is allowed."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration or a time, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return now + float(value)
    text = str(value).strip()
    if re.fullmatch(r"@\d+(?:\.\d+)?", text):  # an epoch time, as `date -d @N` reads it (job scripts)
        return float(text[1:])
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
        if seconds <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return now + seconds
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?", text)
    if m:
        days, a, b, c = (int(g) if g else 0 for g in m.groups())
        seconds = days * 86400 + (a * 3600 + b * 60 + c if m.group(4) else a * 60 + b)
        return now + seconds
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read {text!r}; allowed: seconds (5400), a duration (90m, 1.5h, "
            "01:30:00, 1-06:00:00), a local time (2026-11-23T18:00) or an epoch time (@1795000000)") from None
    return t.timestamp()
