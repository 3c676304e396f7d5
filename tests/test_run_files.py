"""Nothing outside a run directory is written or deleted (issue: "No hang, no silent fork, no file
lost or written outside the run"): not through a symbolic link planted in the run directory, not
in another run's checkpoint directory that ``checkpoint.dir`` or a linked ``checkpoints/`` points
at; and the compilation cache, which every later run executes, lives in a directory only the
user can write.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hpcevo
from configs import small_config
from hpcevo.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


config = small_config
# What a run writes or deletes does not depend on the rank count (rank 0 decides, every rank
# agrees): 1 and 2 ranks cover it.
pytestmark = pytest.mark.ranks(1, 2)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (links not followed) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def on_root(ctx, fn) -> None:
    if ctx.rank == 0:
        fn()
    ctx.comm_ctl.Barrier()


def refused(ctx, data, **kw) -> str:
    with pytest.raises(UsageError) as e:
        hpcevo.run(data, ctx=ctx, quiet=True, **kw)
    everyone = ctx.comm_ctl.allgather(type(e.value).__name__)
    assert everyone == [everyone[0]] * ctx.size
    return str(e.value)


def test_overwrite_never_deletes_another_runs_checkpoints_through_a_link(ctx, shared_tmp):
    victim = hpcevo.run(config(shared_tmp / "victim"), ctx=ctx, quiet=True).run_dir
    before = snapshot(victim)
    assert any(k.startswith("checkpoints/gen-") for k in before)
    mine = shared_tmp / "mine"
    hpcevo.run(config(mine), ctx=ctx, quiet=True)

    def link() -> None:
        for p in (mine / "checkpoints").iterdir():
            p.unlink()
        (mine / "checkpoints").rmdir()
        (mine / "checkpoints").symlink_to(victim / "checkpoints")

    on_root(ctx, link)
    for kw in ({"overwrite": True}, {"resume": True}):
        text = refused(ctx, config(mine, run={"generations": 6}), **kw)
        assert f"belongs to the run in '{victim}'" in text, text
    assert snapshot(victim) == before


def test_checkpoint_dir_naming_another_run_is_refused(ctx, shared_tmp):
    victim = hpcevo.run(config(shared_tmp / "victim"), ctx=ctx, quiet=True).run_dir
    before = snapshot(victim)
    data = config(shared_tmp / "mine", checkpoint={"dir": str(victim / "checkpoints")})
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        text = refused(ctx, data, **kw)
        assert "already holds a run" in text or f"belongs to the run in '{victim}'" in text, text
    assert snapshot(victim) == before
    assert not (shared_tmp / "mine" / "config.toml").exists()


def test_checkpoints_linked_to_scratch_are_this_runs_and_are_kept_there(ctx, shared_tmp):
    """The common layout that must keep working: <run>/checkpoints -> a scratch directory."""
    mine, scratch = shared_tmp / "mine", shared_tmp / "scratch"

    def link() -> None:
        mine.mkdir()
        scratch.mkdir()
        (mine / "checkpoints").symlink_to(scratch)

    on_root(ctx, link)
    first = hpcevo.run(config(mine), ctx=ctx, quiet=True)
    assert sorted(p.name for p in scratch.glob("gen-*.h5")) == ["gen-000000002.h5", "gen-000000004.h5"]
    assert json.loads((scratch / ".hpcevo-run").read_text())["run_dir"] == str(mine.resolve())
    more = hpcevo.run(config(mine, run={"generations": 6}), ctx=ctx, quiet=True, resume=True)
    assert more.summary["resumed_from"] == 4
    again = hpcevo.run(config(mine), ctx=ctx, quiet=True, overwrite=True)
    assert again.digest == first.digest and (mine / "checkpoints").is_symlink()


def test_unclaimed_checkpoints_outside_the_run_are_resumed_but_never_deleted(ctx, shared_tmp):
    ck = shared_tmp / "ck"
    data = config(shared_tmp / "mine", checkpoint={"dir": str(ck)})
    first = hpcevo.run(data, ctx=ctx, quiet=True)
    on_root(ctx, lambda: (ck / ".hpcevo-run").unlink())  # as a run from before runs claimed them
    before = snapshot(ck)
    text = refused(ctx, data, overwrite=True)
    assert "no run claims" in text and snapshot(ck) == before
    resumed = hpcevo.run(config(shared_tmp / "mine", checkpoint={"dir": str(ck)}, run={"generations": 6}), ctx=ctx,
                         quiet=True, resume=True)
    assert resumed.summary["resumed_from"] == 4 and (ck / ".hpcevo-run").exists()
    assert first.status == "complete"


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "summary.json", "failures.jsonl"])
def test_no_file_is_written_through_a_link_planted_in_the_run_directory(ctx, shared_tmp, name):
    victim = shared_tmp / "victim.txt"
    mine = shared_tmp / "mine"
    hpcevo.run(config(mine), ctx=ctx, quiet=True)

    def plant() -> None:
        victim.write_text("precious\n")
        (mine / name).unlink(missing_ok=True)
        (mine / name).symlink_to(victim)
        (mine / "summary.json.tmp").symlink_to(victim)  # where older versions wrote first

    on_root(ctx, plant)
    text = refused(ctx, config(mine, run={"generations": 6}), resume=True)
    assert f"{name} is a symbolic link" in text, text
    hpcevo.run(config(mine), ctx=ctx, quiet=True, overwrite=True)  # removes the link, not its target
    assert victim.read_text() == "precious\n"
    assert not (mine / name).is_symlink() and (mine / "config.toml").is_file()
    assert json.loads((mine / "summary.json").read_text())["status"] == "complete"


# -- the compilation cache ---------------------------------------------------------------------------
def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """``hpcevo`` as a user runs it, with a home of its own and no cache set by the environment."""
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_", "JAX_COMPILATION_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["HOME"] = str(tmp / "home")
    env.pop("XDG_CACHE_HOME", None)
    return subprocess.run([sys.executable, "-m", "hpcevo", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp)


def write_config(tmp: Path, out: Path, extra: str = "") -> Path:
    path = tmp / "c.toml"
    path.write_text(f'[run]\ngenerations = 2\nout = "{out}"\n[algorithm]\nname = "cso"\npop_size = 8\n'
                    f'[problem]\nname = "sphere"\ndim = 2\n{extra}')
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.single_process
@pytest.mark.slow
def test_compile_cache_only_in_a_directory_the_user_alone_can_write(tmp_path):
    # a run directory of its own: the cache beside the runs is created, private
    r = cli(tmp_path, "run", str(write_config(tmp_path, tmp_path / "runs" / "a")), "-q")
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "runs" / ".jax-cache"
    assert json.loads((tmp_path / "runs" / "a" / "summary.json").read_text())["compile_cache"] == str(cache)
    assert mode(cache) == 0o700 and any(cache.iterdir())
    # runs in a shared directory (as /tmp is): its .jax-cache is not used, the user's own is
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    (shared / ".jax-cache").mkdir()
    (shared / ".jax-cache").chmod(0o777)
    r = cli(tmp_path, "run", str(write_config(tmp_path, shared / "b")))
    assert r.returncode == 0, r.stderr
    own = tmp_path / "home" / ".cache" / "hpcevo" / "jax-cache"
    assert json.loads((shared / "b" / "summary.json").read_text())["compile_cache"] == str(own)
    assert f"compile cache '{shared / '.jax-cache'}' is writable by other users (mode 0777); using '{own}'" in r.stdout
    assert not any((shared / ".jax-cache").iterdir()) and mode(own) == 0o700
    # one that belongs to someone else is not used either
    other = tmp_path / "other"
    (other / ".jax-cache").mkdir(parents=True)
    os.chown(other / ".jax-cache", 65534, 65534)
    r = cli(tmp_path, "run", str(write_config(tmp_path, other / "c")))
    assert r.returncode == 0 and "belongs to another user (uid 65534)" in r.stdout, r.stdout + r.stderr
    # a cache named in the config that others can write: refused, one message, nothing run
    r = cli(tmp_path, "run", str(write_config(tmp_path, tmp_path / "runs" / "d",
                                              f'[parallel]\ncompile_cache = "{shared / ".jax-cache"}"\n')))
    assert r.returncode == 2 and r.stderr.count("hpcevo: error:") == 1 and "Traceback" not in r.stderr
    assert "'parallel.compile_cache'" in r.stderr and "writable by other users" in r.stderr
    assert not (tmp_path / "runs" / "d").exists()


@pytest.mark.single_process
def test_the_compile_cache_is_pruned_least_recently_used_first_at_most_once_an_hour(tmp_path):
    """hpcevo bounds the caches it uses itself (JAX's own cap rescans the whole cache on every
    write): entries beyond the cap go, the least recently used first (access or modification
    time, whichever is later), with the -atime files JAX's LRU leaves; a second call within the
    hour is only a stat; a process that finds another pruning skips; other files stay."""
    import fcntl
    import time

    from hpcevo.driver.build import prune_compile_cache

    now = time.time()
    for i in range(6):  # jit_0 is the least recently used, jit_5 the most
        entry = tmp_path / f"jit_{i}-cache"
        entry.write_bytes(b"x" * 1000)
        (tmp_path / f"jit_{i}-atime").write_bytes(b"t")
        os.utime(entry, (now - 600 + 60 * i, now - 6000))
    (tmp_path / "notes.txt").write_text("not an entry")
    # a program hpcevo keeps (driver/programs.py) ages with them, used between jit_1 and jit_2
    kept = tmp_path / "hpcevo-0a1b.program"
    kept.write_bytes(b"p" * 1000)
    os.utime(kept, (now - 600 + 90, now - 6000))
    assert prune_compile_cache(tmp_path, max_bytes=3500) == 4000
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".hpcevo-pruned", "jit_3-atime", "jit_3-cache", "jit_4-atime", "jit_4-cache", "jit_5-atime",
                    "jit_5-cache", "notes.txt"]
    assert prune_compile_cache(tmp_path, max_bytes=0) == 0  # within the hour: nothing listed
    os.utime(tmp_path / ".hpcevo-pruned", (now - 7200, now - 7200))
    with open(tmp_path / ".hpcevo-pruned") as held:  # another process is pruning
        fcntl.flock(held, fcntl.LOCK_EX)
        assert prune_compile_cache(tmp_path, max_bytes=0) == 0
    assert prune_compile_cache(tmp_path, max_bytes=1000) == 2000
    assert sorted(p.name for p in tmp_path.glob("*-cache")) == ["jit_5-cache"]
    assert prune_compile_cache(tmp_path / "nowhere", max_bytes=0) == 0  # never fails a run


@pytest.mark.single_process
def test_a_run_leaves_jaxs_per_write_cache_scan_off_and_prunes_unless_the_environment_caps_it(tmp_path,
                                                                                             monkeypatch):
    import jax

    from hpcevo.driver import build

    cfg = hpcevo.load_config(write_config(tmp_path, tmp_path / "runs" / "a"))
    pruned: list[Path] = []
    monkeypatch.setattr(build, "prune_compile_cache", lambda path: pruned.append(path))
    before, cache_dir = jax.config.jax_compilation_cache_max_size, jax.config.jax_compilation_cache_dir
    try:
        path, _ = build.enable_compile_cache(cfg)
        assert jax.config.jax_compilation_cache_max_size == before  # hpcevo never turns JAX's cap on
        assert pruned == ([Path(path)] if before < 0 else [])
        monkeypatch.setenv("JAX_COMPILATION_CACHE_MAX_SIZE", "1000000")  # the user's choice: JAX's LRU alone
        build.enable_compile_cache(cfg)
        assert len(pruned) == (1 if before < 0 else 0)
    finally:  # (the suite's own cache, where the environment names one, is left as it was)
        jax.config.update("jax_compilation_cache_dir", cache_dir)
