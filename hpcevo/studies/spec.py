"""A study file: a base run config, axes over its keys, seeds; expanded into named runs.

    [study]
    name = "demo"                  # default: the file's name
    seeds = "0-9"                  # "FIRST-LAST", a count (10: seeds 0..9) or a list [1, 5, 7]
    ranks_per_run = 1              # ranks each run gets (groups of this many ranks)
    batch = "auto"                 # runs of one program a group advances together (1: one at a time)
    baseline = "cso"               # the configuration the report compares the others with
    target = 1e-8                  # success: best fitness <= target (per problem: [study.targets])

    [base]                         # a run config (its tables), or base = "path/to/config.toml"
    run.generations = 200
    algorithm.pop_size = 64
    problem.dim = 10

    [[axis]]                       # a grid axis: one key, its values (every combination is run)
    key = "algorithm.name"
    values = ["cso", "de", "pso"]
    [axis.set.de]                  # more keys for one value (by its label)
    "algorithm.F" = 0.6

    [[axis]]                       # a zipped axis: keys that move together
    zip = { "problem.name" = ["sphere", "rastrigin"], "problem.dim" = [10, 20] }
    labels = ["sphere10", "rastrigin20"]   # optional: the values' labels

An axis whose keys are all ``problem.*`` keys (or ``role = "problem"``) tells problems apart;
the other axes tell configurations apart: the report compares configurations on each problem.
A run is named ``<configuration>__<problem>__s<seed>`` from its values' labels and lives in
``<study out>/runs/<name>/``, an ordinary run directory.

Everything here is pure: no MPI, nothing built but what ``build.check`` builds to check a
config, and that once per distinct program (a study's seeds share it), so thousands of runs
validate in seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import schema
from ..config import NAME_PATTERN, RunConfig, apply_overrides, config_from_dict, read_toml
from ..errors import ConfigError, UsageError, did_you_mean

# Keys a study sets itself for every run.
OWN_KEYS = ("run.seed", "run.name", "run.out")
MAX_RUNS = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StudySection(_Strict):
    name: str | None = Field(None, pattern=NAME_PATTERN, max_length=100)
    out: str | None = None  # default: studies/<name>, relative to the working directory
    seeds: str | int | list[int] = 1
    ranks_per_run: int = Field(1, ge=1)
    batch: Literal["auto"] | Annotated[int, Field(ge=1, le=100_000)] = "auto"
    baseline: str | None = None
    target: float | None = None
    targets: dict[str, float] = Field(default_factory=dict)


class Axis(_Strict):
    key: str | None = None
    values: list[Any] | None = None
    zip: dict[str, list[Any]] | None = None
    labels: list[str] | None = None
    role: Literal["problem", "config"] | None = None
    set: dict[str, dict[str, Any]] = Field(default_factory=dict)


class StudyFile(_Strict):
    study: StudySection = StudySection()
    base: dict[str, Any] | str = Field(default_factory=dict)
    axis: list[Axis] = Field(default_factory=list)
    # Shorthands: [axes] "key" = [values] (a grid axis per key), [zip] "key" = [values] (one
    # zipped axis of all its keys); they come before the [[axis]] entries.
    axes: dict[str, Any] = Field(default_factory=dict)
    zip: dict[str, Any] = Field(default_factory=dict)

    def all_axes(self, where: str) -> list[Axis]:
        axes, zipped = _flatten_lists(self.axes), _flatten_lists(self.zip)
        for table, pairs in (("axes", axes), ("zip", zipped)):
            for k, v in pairs:
                if not isinstance(v, list):
                    raise ConfigError(f"{where}: '{table}.{k}': a list of values, got {schema.short(v)}", f"{table}.{k}")
        out = [Axis(key=k, values=v) for k, v in axes]
        if zipped:
            out.append(Axis(zip=dict(zipped)))
        return out + list(self.axis)


def _flatten_lists(table: dict) -> list[tuple[str, Any]]:
    """``{"algorithm": {"name": [...]}}`` (TOML's dotted keys unquoted) as ``("algorithm.name", [...])``."""
    out = []
    for k, v in table.items():
        if isinstance(v, dict):
            out += [(f"{k}.{kk}", vv) for kk, vv in _flatten_lists(v)]
        else:
            out.append((k, v))
    return out


@dataclasses.dataclass(frozen=True)
class Level:
    """One value of an axis: its label and the keys it sets."""

    label: str
    keys: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class AxisPlan:
    keys: tuple[str, ...]
    role: str  # "problem" | "config"
    levels: tuple[Level, ...]


@dataclasses.dataclass(frozen=True)
class StudyRun:
    """One run of a study: its name, what tells it apart, and its config (a checked dict)."""

    index: int
    name: str
    configuration: str  # the label of its configuration (the non-problem axes' values)
    problem: str  # the label of its problem
    seed: int
    settings: tuple[tuple[str, Any], ...]  # the keys its axes set
    data: dict[str, Any]  # the run config's tables (validated: ``config()`` cannot fail)
    source: str

    @property
    def out(self) -> Path:
        return Path(self.data["run"]["out"])

    def config(self) -> RunConfig:
        return config_from_dict(self.data, self.source)

    def cost(self) -> float:
        """A rough size of the run, to start the longest first: its evaluations (the budget where
        that ends it sooner than its generations) times the dimension."""
        run, alg, prob = self.data.get("run", {}), self.data.get("algorithm", {}), self.data.get("problem", {})
        evaluations = float(run.get("generations", 100)) * float(alg.get("pop_size", 100))
        if isinstance(run.get("evaluations"), int):
            evaluations = min(evaluations, float(run["evaluations"]))
        return evaluations * float(prob.get("dim") or 1)

    @property
    def program(self) -> str:
        """What its compiled programs are made of: its config less what is data to them (the
        seed, the BBOB or CEC 2022 function, BBOB's instance, budgets and targets, a built-in
        algorithm's dynamic hyper-parameters) and what never
        reaches them (where and how long it runs, logs, checkpoints). Runs with one value share
        their programs: the first to run compiles them, the others load them from the
        compilation cache."""
        d = {k: dict(v) if isinstance(v, dict) else v for k, v in self.data.items() if k not in ("log", "checkpoint")}
        for key in ("seed", "name", "out", "generations", "evaluations", "target", "target_precision",
                    "stagnation_generations", "stagnation_tolerance", "reevaluate"):
            d.get("run", {}).pop(key, None)
        d.get("problem", {}).pop("instance", None)
        algorithm = d.get("algorithm", {})
        for name in _dynamic(algorithm.get("name")):  # (data to the programs: Algorithm.dynamic)
            algorithm.pop(name, None)
        problem = d.get("problem", {})
        if problem.get("name") == "bbob":  # one program for all 24 functions (problems/bbob.py)
            problem.pop("function", None)
        elif str(problem.get("name", "")).startswith("cec2022_f"):  # and for all 12 (cec2022.py)
            problem["name"] = "cec2022"
        return json.dumps(d, sort_keys=True, default=repr)


def _dynamic(name: Any) -> tuple[str, ...]:
    """A built-in algorithm's dynamic hyper-parameters (none for an algorithm by import path)."""
    from ..algorithms import ALGORITHMS

    cls = ALGORITHMS.get(name) if isinstance(name, str) else None
    return tuple(getattr(cls, "dynamic", ()))


# study.batch = "auto": the runs of one program a group advances together, one wait for all their
# dispatches. On a 2-core CPU it measured no faster than one at a time (a small run's time there
# is its own start and end: docs/studies.md, "Studies batch"); it is meant for accelerators,
# where each dispatch's wait is a small run's cost (not measured yet: set study.batch). A batch
# also holds no more runs than MEMORY_SHARE of the free memory takes (RunBatch.capacity).
AUTO_BATCH = 8


def batch_size(setting: int | str) -> int:
    """The most runs of one program a group advances at once (``study.batch``)."""
    return AUTO_BATCH if setting == "auto" else int(setting)


@dataclasses.dataclass(frozen=True)
class Study:
    """A study file, expanded and checked."""

    name: str
    path: Path | None  # the study file (None: from a dict)
    out: Path
    ranks_per_run: int
    seeds: tuple[int, ...]
    axes: tuple[AxisPlan, ...]
    runs: tuple[StudyRun, ...]
    baseline: str | None
    targets: dict[str, float]  # per problem label (the study's target where none is given)
    target: float | None
    overrides: tuple[str, ...] = ()  # the --set it was loaded with
    batch: int | str = "auto"  # study.batch: runs of one program a group advances at once

    @property
    def configurations(self) -> list[str]:
        return list(dict.fromkeys(r.configuration for r in self.runs))

    @property
    def problems(self) -> list[str]:
        return list(dict.fromkeys(r.problem for r in self.runs))

    def target_for(self, problem: str) -> float | None:
        return self.targets.get(problem, self.target)

    def by_name(self, name: str) -> StudyRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(name)


def load_study(source: str | Path | dict, overrides: Sequence[str] = (), *, check: bool = True) -> Study:
    """The study in a TOML file (or a dict of its tables), after ``overrides`` (``--set`` on the
    study file's keys: ``"base.run.generations=20"``, ``"study.seeds=3"``), expanded into its
    runs, every run's config checked (``check``: also what ``load_config`` checks, once per
    distinct program). ConfigError names the file, the run and the key."""
    if isinstance(source, dict):
        data, where, path = copy.deepcopy(source), "study", None
    elif isinstance(source, (str, Path)):
        path = Path(source)
        data, where = read_toml(path, "study file"), str(path)
    else:
        raise UsageError(f"load_study: 'source' must be the path of a study file or a dict of its tables, got "
                         f"{type(source).__name__}")
    if isinstance(data.get("base"), str):  # (read first, so that --set base.run.generations=... applies)
        data["base"] = _base(data["base"], path, where)
    if overrides:
        apply_overrides(data, overrides)
        where = f"{where} (with --set {' '.join(overrides)})"
    try:
        spec = StudyFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}: " + _validation_text(e), _first_key(e)) from None
    name = spec.study.name or (path.stem if path is not None else "study")
    if not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError(f"{where}: 'study.name': {name!r} cannot name a directory (letters, digits, . _ -); "
                          "set study.name", "study.name")
    base = _base(spec.base, path, where)
    seeds = _seeds(spec.study.seeds, where)
    axes = tuple(_axis(a, i, where) for i, a in enumerate(spec.all_axes(where)))
    _check_one_axis_per_key(axes, overrides, where)
    out = Path(spec.study.out) if spec.study.out else Path("studies") / name
    runs = _expand(base, axes, seeds, out, where)
    study = Study(name, path, out, spec.study.ranks_per_run, seeds, axes, runs, spec.study.baseline,
                  dict(spec.study.targets), spec.study.target, tuple(overrides), spec.study.batch)
    _check_report_keys(study, where)
    if check:
        check_runs(study)
    return study


def _validation_text(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if not schema.is_union_tag(p))
        if err["type"] == "extra_forbidden":
            parts = [p for p in err["loc"] if not schema.is_union_tag(p)]
            model = {"study": StudySection, "axis": Axis}.get(str(parts[0]), StudyFile) if len(parts) > 1 else StudyFile
            valid = list(model.model_fields)
            lines.append(f"unknown key '{loc}'{did_you_mean(parts[-1], valid, 0.5)} (valid: {', '.join(valid)})")
    # (the others one line a key: a union's members merged, "input should be 'auto', or ...; got 0")
    lines += [line for _, line in schema.messages(e.errors(), skip={"extra_forbidden"})]
    return "; ".join(dict.fromkeys(lines))


def _first_key(e: ValidationError) -> str:
    errs = e.errors()
    return ".".join(str(p) for p in errs[0]["loc"]) if errs else ""


def _base(base: dict | str, path: Path | None, where: str) -> dict:
    if isinstance(base, str):
        file = Path(base)
        if not file.is_absolute() and path is not None:
            file = path.parent / file
        try:
            return read_toml(file, "base config")
        except ConfigError as e:
            raise ConfigError(f"{where}: 'base': {e}", "base") from None
    return copy.deepcopy(base)


def _seeds(spec: str | int | list[int], where: str) -> tuple[int, ...]:
    bad = ConfigError(f"{where}: 'study.seeds': {spec!r}: use a count (10: seeds 0..9), \"FIRST-LAST\" "
                      "(\"0-29\") or a list of seeds ([1, 5, 7])", "study.seeds")
    if isinstance(spec, bool):
        raise bad
    if isinstance(spec, int):
        if spec < 1:
            raise bad
        if spec > MAX_RUNS:
            raise ConfigError(f"{where}: 'study.seeds' = {spec}: a study holds at most {MAX_RUNS} runs; split it into "
                              "several", "study.seeds")
        seeds = list(range(spec))
    elif isinstance(spec, str):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-|\.\.)\s*(\d+)\s*", spec)
        if not m or int(m[1]) > int(m[2]):
            raise bad
        if int(m[2]) - int(m[1]) + 1 > MAX_RUNS:  # (before a list that long is made)
            raise ConfigError(f"{where}: 'study.seeds': {spec!r} is {int(m[2]) - int(m[1]) + 1} seeds: a study holds at "
                              f"most {MAX_RUNS} runs; split it into several", "study.seeds")
        seeds = list(range(int(m[1]), int(m[2]) + 1))
    else:
        seeds = list(spec)
        if not seeds or any(isinstance(s, bool) or s < 0 for s in seeds):
            raise bad
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: 'study.seeds': a seed is listed twice", "study.seeds")
    return tuple(seeds)


def _axis(a: Axis, i: int, where: str) -> AxisPlan:
    at = f"{where}: axis {i + 1}"
    if (a.key is None) == (a.zip is None) or (a.key is not None) != (a.values is not None):
        raise ConfigError(f"{at}: give either key and values (a grid axis) or zip (keys that move together)",
                          f"axis[{i}]")
    if a.key is not None:
        keys, columns = (a.key,), [a.values]
    else:
        keys, columns = tuple(a.zip), list(a.zip.values())
    for key in keys:
        _check_key(key, at, i)
    n = len(columns[0]) if columns else 0
    if not keys or n == 0 or any(len(c) != n for c in columns):
        raise ConfigError(f"{at}: every key needs a non-empty list of values, and zipped lists one length "
                          f"(got {', '.join(f'{k}: {len(c)}' for k, c in zip(keys, columns))})", f"axis[{i}]")
    rows = [tuple(zip(keys, row)) for row in zip(*columns)]
    if a.labels is not None:
        if len(a.labels) != n:
            raise ConfigError(f"{at}: {len(a.labels)} labels for {n} values", f"axis[{i}].labels")
        labels = [_clean(lab) for lab in a.labels]
    else:
        labels = [_label(row, at, i) for row in rows]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup or any(not lab for lab in labels):
        raise ConfigError(f"{at}: values must have distinct, non-empty labels (twice: {', '.join(dup) or '-'}); "
                          "give them with labels = [...]", f"axis[{i}].labels")
    extra = {}
    for label, table in a.set.items():
        if label not in labels:
            raise ConfigError(f"{at}: 'set.{label}': no value of this axis is labelled {label!r}"
                              f"{did_you_mean(label, labels)} (labels: {', '.join(labels)})", f"axis[{i}].set")
        extra[label] = tuple(_flatten(table))
        for key, _ in extra[label]:
            _check_key(key, at, i)
    role = a.role or ("problem" if all(k.startswith("problem.") for k in keys) else "config")
    levels = tuple(Level(lab, row + extra.get(lab, ())) for lab, row in zip(labels, rows))
    return AxisPlan(keys, role, levels)


def _check_one_axis_per_key(axes: tuple[AxisPlan, ...], overrides: Sequence[str], where: str) -> None:
    """A key is set by one axis at most, and not by --set on the base as well: otherwise the
    later silently wins, and runs labelled "cso" and "de" could both run what the last one set.
    (The [axes] and [zip] shorthands are axes too, numbered first.)"""
    setters: dict[str, list[int]] = {}
    for i, axis in enumerate(axes):
        keys = {k for lv in axis.levels for k, _ in lv.keys} | set(axis.keys)
        for key in keys:
            setters.setdefault(key, []).append(i)
    for key, at in setters.items():
        if len(at) > 1:
            raise ConfigError(f"{where}: '{key}' is set by axes {' and '.join(str(i + 1) for i in at)}: one axis per "
                              "key (a zipped axis moves keys together; a set table adds a key to one axis's values)",
                              f"axis[{at[1]}]")
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if not key.startswith("base."):
            continue
        key = key[len("base."):]
        hit = [k for k in setters if k == key or k.startswith(key + ".") or key.startswith(k + ".")]
        if hit:
            raise ConfigError(f"{where}: --set {key!r} on the base, but axis {setters[hit[0]][0] + 1} sets "
                              f"'{hit[0]}' for every run: the axis would win. Change the axis's values instead",
                              f"axis[{setters[hit[0]][0]}]")


def _check_key(key: str, at: str, i: int) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", key):
        raise ConfigError(f"{at}: {key!r} is not a config key (section.key, e.g. \"algorithm.pop_size\")",
                          f"axis[{i}]")
    if key in OWN_KEYS:
        raise ConfigError(f"{at}: '{key}' is set by the study for every run (seeds: study.seeds; names and "
                          "directories follow from the labels)", f"axis[{i}]")


def _flatten(table: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """A ``set`` table as dotted keys: ``"algorithm.F" = 0.6`` and ``algorithm.F = 0.6`` (a
    nested table in TOML) alike; below ``section.key`` a value stays whole (``problem.args``)."""
    out = []
    for k, v in table.items():
        parts = prefix + tuple(k.split("."))
        if len(parts) < 2 and isinstance(v, dict):
            out += _flatten(v, parts)
        else:
            out.append((".".join(parts), v))
    return out


def _label(row: tuple[tuple[str, Any], ...], at: str, i: int) -> str:
    parts = []
    for key, value in row:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{at}: values of '{key}' are tables or lists: name them with labels = [...]",
                              f"axis[{i}].labels")
        if isinstance(value, str):
            parts.append(value.rsplit(":", 1)[-1].rsplit("/", 1)[-1] if key.endswith(".name") else value)
        elif key.endswith(".name"):
            parts.append(str(value))
        else:
            parts.append(f"{key.rsplit('.', 1)[-1]}{_number(value)}")
    return _clean("-".join(parts))


def _number(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return str(v).lower()


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-._")[:60]


def _set(data: dict, key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"'{key}': '{p}' is a value in the base config, not a table", key)
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)


def _expand(base: dict, axes: tuple[AxisPlan, ...], seeds: tuple[int, ...], out: Path,
            where: str) -> tuple[StudyRun, ...]:
    total = math.prod(len(a.levels) for a in axes) * len(seeds)
    if total > MAX_RUNS:
        raise ConfigError(f"{where}: {total} runs: a study holds at most {MAX_RUNS}; split it into several",
                          "axis")
    width = len(str(max(seeds)))
    default_config = _clean((base.get("algorithm") or {}).get("name", "config")) if isinstance(
        base.get("algorithm"), dict) else "config"
    default_problem = _clean(str((base.get("problem") or {}).get("name", "problem")).rsplit(":", 1)[-1]) if isinstance(
        base.get("problem"), dict) else "problem"
    runs, seen = [], {}
    for combo in itertools.product(*(a.levels for a in axes)):
        config = "-".join(lv.label for a, lv in zip(axes, combo) if a.role == "config") or default_config
        problem = "-".join(lv.label for a, lv in zip(axes, combo) if a.role == "problem") or default_problem
        settings = tuple(kv for lv in combo for kv in lv.keys)
        for seed in seeds:
            name = f"{config}__{problem}__s{seed:0{width}d}"
            if name in seen:
                raise ConfigError(f"{where}: two runs would be named {name!r} ({seen[name]} and "
                                  f"{dict(settings)}): give the axes labels that tell them apart", "axis")
            seen[name] = dict(settings)
            data = copy.deepcopy(base)
            for key, value in settings:
                try:
                    _set(data, key, value)
                except ConfigError as e:
                    raise ConfigError(f"{where}: run '{name}': {e}", key) from None
            _set(data, "run.seed", seed)
            _set(data, "run.name", name)
            _set(data, "run.out", str(out / "runs" / name))
            runs.append(StudyRun(len(runs), name, config, problem, seed, settings, data,
                                 f"{where}: run '{name}'"))
    return tuple(runs)


def _check_report_keys(study: Study, where: str) -> None:
    if study.baseline is not None and study.baseline not in study.configurations:
        raise ConfigError(f"{where}: 'study.baseline': no configuration is labelled {study.baseline!r}"
                          f"{did_you_mean(study.baseline, study.configurations)} (configurations: "
                          f"{', '.join(study.configurations)})", "study.baseline")
    for label in study.targets:
        if label not in study.problems:
            raise ConfigError(f"{where}: 'study.targets.{label}': no problem is labelled {label!r}"
                              f"{did_you_mean(label, study.problems)} (problems: {', '.join(study.problems)})",
                              "study.targets")


def check_runs(study: Study) -> None:
    """Every run's config through the schema, and what ``load_config`` checks once per
    distinct program; ConfigError names the first run that fails (and how many share it)."""
    from ..driver import build, rules

    programs: dict[str, list[tuple[StudyRun, RunConfig]]] = {}
    for run in study.runs:
        cfg = run.config()  # the schema: ConfigError names the run through its source
        programs.setdefault(build.program_key(cfg), []).append((run, cfg))
    for runs in programs.values():
        try:
            _built_from_the_config_alone(runs[0][1])
            problem = build.check(runs[0][1])
        except ConfigError as e:
            others = f" (and {len(runs) - 1} more run{'s' if len(runs) > 2 else ''} of the same config)" if len(
                runs) > 1 else ""
            raise ConfigError(f"{e}{others}", e.key) from None
        if problem is not None:  # the rules across keys, which settings outside the program change
            for _, cfg in runs[1:]:
                rules.check(cfg, problem)


def _built_from_the_config_alone(cfg: RunConfig) -> None:
    """A run config may leave the algorithm or the problem to Python (``hpcevo.run(...,
    problem=f)``), and ``build.check`` then passes it; a study's runs are built from their
    configs alone, so without them every run would start and fail, one by one."""
    if cfg.algorithm is None:
        raise ConfigError(f"{cfg.source}: missing required key 'algorithm' (a table with name and pop_size, in "
                          "the study's base or set by an axis)", "algorithm")
    if cfg.problem.name is None:
        raise ConfigError(f"{cfg.source}: missing required key 'problem.name' (in the study's base or set by an "
                          "axis)", "problem.name")
