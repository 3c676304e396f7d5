"""A resume never forks a run silently: every key of the resolved config, changed in turn between
a run's stop and its resume, gives either a continuation bitwise equal to the run that never
stopped, or a refusal naming the key (issue: "No hang, no silent fork..."). The keys come from
the resolved config itself, so a key added to the schema is covered the day it is added (the
test asks for a way to change it).
"""

from __future__ import annotations

import copy
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hpcevo
from hpcevo.driver import build
from hpcevo.driver.resume import FREE, is_free
from hpcevo.errors import UsageError
from hpcevo.hooks import every_rank

pytestmark = [pytest.mark.single_process, pytest.mark.slow]

STOP, END = 3, 6

# New values for keys whose values are names or choices; numbers, booleans and lists of tables
# are changed by type (``changed``).
TEXT = {
    "run.name": "renamed", "run.dtype": "float64", "algorithm.name": "pso", "problem.name": "ackley",
    "log.progress": "bar", "parallel.device": "cpu", "parallel.compile_cache": "off",
    "checkpoint.deadline": "11h", "islands.topology": "all", "islands.emigrants": "random",
    "algorithm.strategy": "current-to-best/1/bin",
    "islands.replace": "random", "evaluation.schedule": "dynamic",
}
HOST_PROBLEMS = textwrap.dedent("""
    import numpy as np
    def sphere(x):
        return np.sum((x - 0.25) ** 2, axis=1)
    def shifted(x):
        return np.sum((x - 0.5) ** 2, axis=1)
    """)


def bases(tmp: Path) -> dict[str, dict]:
    """Configs that between them hold every kind of key: a plain run, islands, a host problem."""
    (tmp / "hostprob.py").write_text(HOST_PROBLEMS)
    common = {"log": {"every": 1, "progress": "lines"},
              "checkpoint": {"every": STOP, "every_seconds": 0.0, "deadline": "10h"}}
    plain = {"run": {"name": "base", "seed": 1, "generations": END},
             "algorithm": {"name": "cso", "pop_size": 8, "phi": 0.1},
             "problem": {"name": "sphere", "dim": 3, "lb": -5.0, "ub": 5.0}, **copy.deepcopy(common)}
    islands = {**copy.deepcopy(plain), "islands": {"count": 2, "migrate_every": 2, "migrants": 1,
                                                  "island": [{"at": 1, "algorithm": {"name": "de"}}]}}
    host = {"run": {"name": "host", "seed": 1, "generations": END}, "algorithm": {"name": "de", "pop_size": 6},
            "problem": {"name": f"{tmp / 'hostprob.py'}:sphere", "host": True, "dim": 2, "lb": -1.0, "ub": 1.0},
            "evaluation": {"concurrency": 1, "penalty": 1e30}, **copy.deepcopy(common)}
    return {"plain": plain, "islands": islands, "host": host}


def flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed(key: str, value: Any, tmp: Path) -> Any:
    """Another valid value for ``key``."""
    if key == "run.out":
        return str(tmp / "moved")
    if key == "checkpoint.dir":
        return str(tmp / "other-checkpoints")
    if key == "problem.name" and ":" in str(value):
        return str(value).replace(":sphere", ":shifted")
    if key in TEXT:
        assert TEXT[key] != value, key
        return TEXT[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 2
    if isinstance(value, float):
        return value * 0.5 if value else 0.5
    if key == "islands.island":
        return [{"at": 1, "algorithm": {"name": "pso"}}]
    raise AssertionError(f"no way to change '{key}' = {value!r}: add one to tests/test_resume_lock.py")


def set_key(data: dict, key: str, value: Any) -> dict:
    data = copy.deepcopy(data)
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    if key == "algorithm.name":  # another algorithm: its own hyper-parameters, from their defaults
        data["algorithm"] = {"name": value, "pop_size": data["algorithm"]["pop_size"]}
    return data


def _is_dynamic(base: dict, key: str) -> bool:
    from hpcevo.algorithms.base import dynamic_names

    cfg = hpcevo.load_config(base)
    return key.split(".", 1)[1] in dynamic_names(build.build_algorithm(cfg, build.build_problem(cfg)))


def run(ctx, data: dict, out: Path, **kw):
    return hpcevo.run(set_key(data, "run.out", str(out)), ctx=ctx, quiet=True, **kw)


def _set_at_stop(key: str, value: Any):
    """An every-rank hook that sets the dynamic hyper-parameter ``key`` at generation STOP."""
    @every_rank
    def hook(record, loop):
        if record["generation"] == STOP:
            loop.set_params(**{key.split(".", 1)[1]: value})
    return hook


def test_every_key_of_the_resolved_config_resumes_bitwise_or_is_refused_by_name(ctx, tmp_path):
    """(A dynamic hyper-parameter, which Loop.set_params may change mid-run, may change on resume
    too: the continuation then equals the run in which a hook set it at the resume's generation.)"""
    refused, accepted, dynamic = set(), set(), set()
    for label, base in bases(tmp_path).items():
        reference = run(ctx, base, tmp_path / label / "ref").digest  # the run that never stopped
        stopped = tmp_path / label / "stopped"
        run(ctx, set_key(base, "run.generations", STOP), stopped)
        for key, value in flat(build.resolved(hpcevo.load_config(set_key(base, "run.out", str(stopped))))).items():
            if key == "run.generations":
                continue  # what a resume is for: every resume below continues from STOP to END
            out = tmp_path / label / key
            shutil.copytree(stopped, out)  # (the stopped run, under another name: the same run)
            data = set_key(base, key, changed(key, value, tmp_path / label))
            if key == "run.out":
                shutil.copytree(out, data["run"]["out"])
            try:
                result = hpcevo.run(data if key == "run.out" else set_key(data, "run.out", str(out)),
                                    ctx=ctx, quiet=True, resume=True)
            except UsageError as e:
                # refused, naming the key: as a change that forks the run, or a config that cannot run
                assert f"{key}: checkpoint has" in str(e) or key in str(e), (label, key, str(e))
                refused.add(key)
                continue
            expected = reference
            if key.startswith("algorithm.") and label != "islands" and _is_dynamic(base, key):
                expected = run(ctx, base, tmp_path / label / f"hooked-{key}",
                               hooks=_set_at_stop(key, data["algorithm"][key.split(".", 1)[1]])).digest
                assert expected != reference  # (the change does change the run)
                dynamic.add(key)
            assert result.digest == expected, f"{label}: changing '{key}' on resume forked the run silently"
            assert result.summary["resumed_from"] == STOP or key == "run.out", (label, key)
            accepted.add(key)
    # What changes the computation is refused (a coincidence of digests would not hide it) ...
    must_refuse = {"run.seed", "run.dtype", "algorithm.name", "algorithm.pop_size", "problem.name",
                   "problem.dim", "problem.lb", "problem.ub", "parallel.microbatch", "evaluation.penalty",
                   "problem.host", "islands.count", "islands.migrate_every", "islands.migrants", "islands.topology",
                   "islands.emigrants", "islands.replace", "islands.island"}
    assert must_refuse <= refused, must_refuse - refused
    # ... and what was accepted is what the allow-list (named in every refusal) says may change
    assert all(is_free(k) or k == "evaluation.batch_size" or k in dynamic for k in accepted), accepted
    assert {"algorithm.phi", "algorithm.F", "algorithm.CR"} <= dynamic, dynamic  # (CSO's and DE's)
    assert "algorithm.phi" in refused  # (with [islands]: each island's own)
    assert {"log.every", "checkpoint.every", "run.name", "run.out", "evaluation.schedule",
            "evaluation.concurrency", "parallel.threads_per_rank"} <= accepted, accepted
    assert "evaluation.batch_size" in accepted  # sphere is block invariant: pieces give the same bits
    assert "evaluation.batch_size" in refused  # a NumPy function is not known to be
    assert "run.generations" in FREE
