"""One schema for every number and choice a user hands hpcevo, from a config file or from Python.

The config's sections (``config.py``) and the Python objects that take the same settings
(``hpcevo.Migration``, ``hpcevo.Loop``'s and ``hpcevo.run``'s arguments, an algorithm's
hyper-parameters) check them with the field types below, so a value refused in a TOML file is
refused in Python with the same words, and a value accepted in one is accepted in the other.

Values are checked strictly (TOML is typed: ``"100"`` for an integer is a mistake to report, not to
coerce; ``True`` is not an integer), except that NumPy scalars count as the Python numbers they
hold: ``np.int64(5)`` is an integer, ``np.float32(0.5)`` a float.

``check(kind, value, name)`` returns the value as plain Python or raises ``ConfigError`` whose key
is ``name``; ``messages(errors)`` turns pydantic's errors into lines that name the key, what was
given and what is allowed, without pydantic's internal names for the members of a union.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import ConfigError

INT32_MAX = 2**31 - 1


def _not_nan(v: float) -> float:
    if math.isnan(v):  # NaN never equals itself: every resume would look like a changed value
        raise ValueError("must be a number or inf, not nan (inf: the worst fitness)")
    return v


# -- field types shared by the config's sections and the API's objects -------------------------
Seed = Annotated[int, Field(ge=0, lt=2**32)]
Generations = Annotated[int, Field(ge=1, le=INT32_MAX)]  # a 32-bit counter inside the jitted loop
Reevaluations = Annotated[int, Field(ge=0, le=100_000)]
PopSize = Annotated[int, Field(ge=1, le=INT32_MAX)]
Dim = Annotated[int, Field(ge=1, le=INT32_MAX)]
DType = Literal["float32", "float64"]
Device = Literal["auto", "cpu", "gpu"]
Threads = Annotated[int, Field(ge=1, le=4096)] | Literal["auto"]
Microbatch = Annotated[int, Field(ge=0, le=INT32_MAX)]  # 0: automatic
BatchSize = Annotated[int, Field(ge=0, le=INT32_MAX)]  # 0: a whole micro-batch per call
Concurrency = Annotated[int, Field(ge=1, le=4096)]
Schedule = Literal["static", "dynamic"]
Penalty = Annotated[float, AfterValidator(_not_nan)]
IslandCount = Annotated[int, Field(ge=1, le=4096)]
MigrateEvery = Annotated[int, Field(ge=1, le=INT32_MAX)]
Migrants = Annotated[int, Field(ge=0, le=INT32_MAX)]
Topology = Literal["ring", "all", "random"]
Emigrants = Literal["best", "random"]
Replace = Literal["worst", "random"]
Progress = Literal["auto", "bar", "lines"]

STRICT = ConfigDict(strict=True)


@functools.lru_cache(maxsize=None)
def adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind, config=STRICT)


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars (and 0-d arrays) as the Python numbers they hold, in nested
    lists, tuples and dicts too; anything else unchanged."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == () and type(value).__module__ == "numpy":
        return item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def check(kind: Any, value: Any, name: str, where: str = "") -> Any:
    """``value`` (as plain Python) if it is a valid ``kind``; else ``ConfigError`` with key ``name``
    and a message ``"<where>: '<name>': <what is allowed>; got <value>"``."""
    value = plain(value)
    try:
        return adapter(kind).validate_python(value)
    except ValidationError as e:
        text = "; ".join(line for _, line in messages(e.errors(), prefix=name))
        raise ConfigError(f"{where}: {text}" if where else text, name) from None


# Parts of a pydantic error location that name a member of a union, not a key or list index.
_UNION_TAG = re.compile(r"[\[\]\-'(]")
_TYPE_NAMES = {"int", "float", "str", "bool", "none", "bytes", "dict", "list", "tuple"}


def is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _TYPE_NAMES or bool(_UNION_TAG.search(part)))


def key_of(loc: tuple, prefix: str = "") -> str:
    """The dotted key of a pydantic error location (``islands.island[0].at``), union tags dropped."""
    key = prefix
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif not is_union_tag(part):
            key = f"{key}.{part}" if key else str(part)
    return key


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut short: a 10,000-element list would bury the message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def messages(errors: list[dict], prefix: str = "", skip: set[str] | None = None) -> list[tuple[str, str]]:
    """(key, line) per key: the errors of one key (one per member of a union) merged into one
    line, ``"'run.seed': input should be greater than or equal to 0; got -1"``. Errors of a type
    in ``skip`` are left to the caller."""
    merged: dict[str, tuple[list[str], Any]] = {}
    for e in errors:
        if skip and e["type"] in skip:
            continue
        key = key_of(tuple(e["loc"]), prefix)
        if e["type"] == "value_error":  # our own validators' messages, kept as written
            text = str(e.get("ctx", {}).get("error", e["msg"]))
        else:
            text = e["msg"][:1].lower() + e["msg"][1:]  # lower-casing all would change a regex it shows
        texts, _ = merged.setdefault(key, ([], e.get("input")))
        if text not in texts:
            texts.append(text)
    out = []
    for key, (texts, given) in merged.items():
        first, rest = texts[0], [t.removeprefix("input should be ") for t in texts[1:]]
        text = ", or ".join([first, *rest])
        out.append((key, f"'{key}': {text}" + ("" if texts[0].startswith(("must", "got")) else f"; got {short(given)}")))
    return out
