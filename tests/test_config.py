"""Config: schema, overrides, messages. Pure and identical on every rank, plus the CLI's exit 2."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import hpcevo
from hpcevo import cli
from hpcevo.config import config_from_dict, parse_override
from hpcevo.driver import build
from hpcevo.errors import ConfigError

# The rank matrix: what these MPI tests check (an error or an input on some ranks reaching
# every rank) needs a last rank and a middle one: 2 and 3 ranks have them, 4 repeats them.
pytestmark = pytest.mark.ranks(1, 2, 3)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cso.toml"


def base() -> dict:
    return {
        "run": {"name": "t", "seed": 1, "generations": 10},
        "algorithm": {"name": "cso", "pop_size": 16},
        "problem": {"name": "sphere", "dim": 3, "lb": -5.0, "ub": 5.0},
    }


def load(data: dict, overrides=()):
    """What hpcevo.load_config does with a dict, named "t.toml" in its messages."""
    cfg = config_from_dict(data, "t.toml", overrides)
    build.check(cfg)
    return cfg


def error_of(data: dict, overrides=()) -> str:
    with pytest.raises(ConfigError) as e:
        load(data, overrides)
    return str(e.value)


@pytest.mark.single_process
def test_example_loads_with_defaults():
    cfg = hpcevo.load_config(EXAMPLE)
    assert cfg.algorithm.name == "cso" and cfg.algorithm.pop_size == 1024
    assert cfg.problem.dim == 100 and cfg.run.seed == 42
    assert cfg.out_dir == Path("runs/cso-ackley")
    assert cfg.parallel.threads_per_rank == 1


@pytest.mark.single_process
def test_unknown_key_names_nearest():
    d = base()
    d["run"]["generatoins"] = 5
    msg = error_of(d)
    assert "t.toml" in msg and "run.generatoins" in msg and "did you mean 'generations'" in msg


@pytest.mark.single_process
def test_unknown_section_names_nearest():
    d = base()
    d["problme"] = {}
    msg = error_of(d)
    assert "unknown section 'problme'" in msg and "did you mean 'problem'" in msg


@pytest.mark.single_process
def test_unknown_algorithm_hyperparameter_names_nearest():
    d = base()
    d["algorithm"]["phii"] = 0.1
    msg = error_of(d)
    assert "algorithm.phii" in msg and "did you mean 'phi'" in msg


@pytest.mark.single_process
def test_wrong_type_is_not_coerced():
    d = base()
    d["run"]["generations"] = "100"
    msg = error_of(d)
    assert "'run.generations'" in msg and "'100'" in msg and "integer" in msg


@pytest.mark.single_process
def test_wrong_type_for_hyperparameter():
    d = base()
    d["algorithm"]["phi"] = "big"
    msg = error_of(d)
    assert "'algorithm.phi'" in msg and "'big'" in msg


@pytest.mark.single_process
def test_out_of_range_values():
    d = base()
    d["run"]["generations"] = 0
    assert "'run.generations'" in error_of(d) and "greater than or equal to 1" in error_of(d)
    d = base()
    d["algorithm"]["phi"] = 3.0
    assert "phi must be in [0, 1]" in error_of(d)


@pytest.mark.single_process
def test_bad_bounds():
    d = base()
    d["problem"]["lb"], d["problem"]["ub"] = 5.0, -5.0
    msg = error_of(d)
    assert "[problem]" in msg and "lb" in msg


@pytest.mark.single_process
def test_unknown_problem_and_algorithm():
    d = base()
    d["problem"]["name"] = "ackly"
    assert "ackley" in error_of(d)
    d = base()
    d["algorithm"]["name"] = "csoo"
    msg = error_of(d)
    assert "unknown algorithm 'csoo'" in msg and "did you mean 'cso'" in msg


@pytest.mark.single_process
def test_missing_required_key():
    d = base()
    del d["algorithm"]["name"]
    assert "missing required key 'algorithm.name'" in error_of(d)


@pytest.mark.single_process
def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        hpcevo.load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        hpcevo.load_config(bad)


@pytest.mark.single_process
def test_overrides_are_typed_like_toml():
    assert parse_override("run.generations=500") == (["run", "generations"], 500)
    assert parse_override("problem.lb=-1.5") == (["problem", "lb"], -1.5)
    assert parse_override("run.name=foo") == (["run", "name"], "foo")
    assert parse_override('run.name="a b"') == (["run", "name"], "a b")
    assert parse_override("problem.lb=[1.0, 2.0]") == (["problem", "lb"], [1.0, 2.0])
    cfg = hpcevo.load_config(base(), overrides=["run.generations=7", "algorithm.phi=0.2", "log.every=3"])
    assert cfg.run.generations == 7 and cfg.algorithm_params["phi"] == 0.2 and cfg.log.every == 3


@pytest.mark.single_process
def test_override_errors():
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        hpcevo.load_config(base(), overrides=["run.generations"])
    msg = error_of(base(), ["run.seed.x=1"])
    assert "'run.seed' is a value" in msg
    msg = error_of(base(), ["run.generations=ten"])
    assert "--set run.generations=ten" in msg and "'run.generations'" in msg


@pytest.mark.single_process
def test_resolved_config_round_trips():
    cfg = hpcevo.load_config(base())
    text = build.dump(build.resolved(cfg))
    data = tomllib.loads(text)
    assert data["algorithm"]["phi"] == 0.1  # the algorithm's published default, filled in
    assert build.resolved(hpcevo.load_config(data)) == build.resolved(cfg)


def test_cli_bad_config_exits_2_everywhere_with_one_message(ctx, shared_tmp, capsys):
    bad = shared_tmp / "typo.toml"
    if ctx.rank == 0:
        bad.write_text(EXAMPLE.read_text().replace("generations", "generatons"))
    ctx.comm_ctl.Barrier()
    code = cli.main(["run", str(bad)])
    out, err = capsys.readouterr()
    assert code == 2
    if ctx.rank == 0:
        assert err.count("error:") == 1
        assert "run.generatons" in err and "did you mean 'generations'" in err
    else:
        assert err == "" and out == ""


def test_cli_error_on_one_rank_only_reaches_all(ctx, shared_tmp, capsys):
    """A config file that exists on rank 0 only (another node's filesystem): no rank goes on."""
    if ctx.rank == 0:
        (shared_tmp / "only-root.toml").write_text(EXAMPLE.read_text())
    ctx.comm_ctl.Barrier()
    path = shared_tmp / "only-root.toml" if ctx.rank == 0 else shared_tmp / "missing.toml"
    code = cli.main(["run", str(path), "--set", f"run.out={shared_tmp / 'out'}"])
    out, err = capsys.readouterr()
    if ctx.size == 1:
        assert code == 0  # rank 0 alone: the file is there and the run completes
        return
    assert code == 2
    if ctx.rank == 0:
        assert "not found" in err and "reported by rank 1" in err
    assert not (shared_tmp / "out" / "summary.json").exists()


def test_cli_bad_argument_exits_2(ctx, capsys):
    assert cli.main(["run"]) == 2
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert ("required" in err) if ctx.rank == 0 else err == ""


@pytest.mark.single_process
def test_typo_in_required_key_names_the_typo():
    d = base()
    d["algorithm"]["pop_sise"] = d["algorithm"].pop("pop_size")
    msg = error_of(d)
    assert "unknown key 'algorithm.pop_sise'" in msg and "did you mean 'pop_size'" in msg
