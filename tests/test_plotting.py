"""`hpcevo plot`: axes that stay readable over decades, panels, and runs grouped for comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcevo.tools import plotting

pytestmark = pytest.mark.single_process


def test_scales_follow_the_values():
    assert plotting.scale_for(np.geomspace(1e-1, 1e-16, 50))[0] == "log"
    name, kw = plotting.scale_for(np.r_[np.geomspace(1e-1, 1e-16, 50), 0.0])
    assert name == "symlog" and 0 < kw["linthresh"] < 1.01e-16
    assert plotting.scale_for(np.r_[-1e6, np.linspace(-10, 10, 5)])[0] == "symlog"
    assert plotting.scale_for(np.linspace(2.0, 20.0, 10))[0] == "linear"
    assert plotting.scale_for(np.array([np.nan, np.inf]))[0] == "linear"


def fake_run(root: Path, name: str, seed: int, phi: float, decay: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(
        f'[run]\nname = "{name}"\nseed = {seed}\ngenerations = 50\n[algorithm]\nname = "cso"\npop_size = 8\n'
        f'phi = {phi}\n[problem]\nname = "sphere"\ndim = 2\n')
    with open(run / "metrics.jsonl", "w") as f:
        for g in range(5, 55, 5):
            best = 10.0 * decay ** g
            f.write(json.dumps({"generation": g, "evaluations": 8 * g, "best": best, "gen_best": best,
                                "gen_mean": 2 * best, "gen_std": best, "nonfinite": 0, "wall_s": 0.01 * g,
                                "evals_per_s": 800.0}) + "\n")
    return run


def test_runs_that_differ_only_in_seed_form_one_group(tmp_path):
    runs = [fake_run(tmp_path, f"a{s}", s, 0.1, 0.8 + 0.01 * s) for s in range(3)]
    runs.append(fake_run(tmp_path, "b", 0, 0.0, 0.95))
    groups = plotting.groups([plotting.load(r) for r in runs])
    assert sorted(groups) == ["phi=0.0", "phi=0.1"] and len(groups["phi=0.1"]) == 3
    out = plotting.plot(runs, tmp_path / "cmp.png")
    assert out.stat().st_size > 10_000
    single = plotting.plot([runs[0]])
    assert single == runs[0] / "convergence.png" and single.is_file()
    assert plotting.groups([plotting.load(r) for r in runs[:3]]).keys() == {"all runs"}
