"""Checkpoints in-process, at whatever rank count the suite runs: format, checksums, atomic
publish, failed writes, resume equivalence, stop agreement. Launcher-level scenarios (SIGKILL,
SIGUSR1 to mpiexec, truncation, unwritable directory) are in test_survive.py."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo import checkpoint
from hpcevo.config import parse_deadline
from hpcevo.driver import build
from hpcevo.driver.recording import History
from hpcevo.driver.resume import resume_conflicts
from hpcevo.driver.stopping import Deadline, StopFlag
from hpcevo.errors import CheckpointError, UsageError
from hpcevo.parallel import context_for

# Blocks of ~4 KiB and splitting from 8 KiB up: every rank writes part of "big".
SMALL_BLOCKS = checkpoint.Layout(block_bytes=4096, split_min_bytes=8192)


def tree(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "big": rng.standard_normal((3001, 37)).astype(np.float32),  # many blocks when blocks are small
        "f64": rng.standard_normal((5, 2)),
        "ints": np.arange(7, dtype=np.int32),
        "key": np.asarray(jax.random.PRNGKey(seed)),  # legacy uint32 key
        "flag": np.array(True),
        "scalar": np.float32(3.5),
        "empty": np.zeros((0, 4), np.float32),
    }


def snapshot(state, generation=10):
    hist = {k: np.arange(generation, dtype=np.float64) for k in History._fields}
    hist["nonfinite"] = np.zeros(generation, np.int32)
    return checkpoint.Snapshot(generation, 100 + generation, 7, "[run]\nname = 'x'\n", state, hist, 20, 10)


def template_of(state):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), state)


def assert_same(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def test_roundtrip_is_bitwise_and_split_between_ranks(ctx, shared_tmp):
    state = tree()
    path = checkpoint.write(ctx, shared_tmp, snapshot(state), layout=SMALL_BLOCKS)
    assert path.name == "gen-000000010.h5"
    assert not list(shared_tmp.glob(".*partial"))
    loaded = checkpoint.load(ctx, path, template_of(state))
    assert_same(loaded.state, state)
    assert loaded.header.generation == 10 and loaded.header.ranks == ctx.size
    assert loaded.header.evaluations == 110 and loaded.header.num_init == 20
    assert list(loaded.history["best"]) == list(range(10))
    if ctx.is_root:
        report = checkpoint.verify_file(path)
        assert report.problem is None, report.problem
    # The same file read on one rank alone (a resume at another rank count) gives the same state.
    alone = checkpoint.load(context_for(MPI.COMM_SELF), path, template_of(state))
    assert_same(alone.state, state)


def test_checkpoint_records_the_hosts_of_its_writers(ctx, shared_tmp):
    path = checkpoint.write(ctx, shared_tmp, snapshot(tree()), layout=SMALL_BLOCKS)
    header = checkpoint.read_header(ctx, path)
    assert header.hosts == tuple(ctx.hosts) and header.ranks == ctx.size
    hosts = len(ctx.hosts)
    assert header.writers == (f"{ctx.size} rank{'s' if ctx.size > 1 else ''} on {hosts} host{'s' if hosts > 1 else ''} "
                              f"({', '.join(ctx.hosts)})")


def test_a_checkpoint_from_before_hosts_were_recorded_still_reads(tmp_path):
    import h5py

    alone = context_for(MPI.COMM_SELF)
    path = checkpoint.write(alone, tmp_path, snapshot(tree()), layout=SMALL_BLOCKS)
    with h5py.File(path, "r+") as f:
        del f.attrs["hosts"]
    header = checkpoint.read_header(alone, path)
    assert (header.hosts, header.writers) == ((), "1 rank")
    assert checkpoint.verify_file(path).problem is None
    with h5py.File(path, "r+") as f:
        f.attrs["hosts"] = "node1, node2"
    assert checkpoint.verify_file(path).problem == "attribute 'hosts' is not valid JSON"


def test_typed_prng_key_roundtrip(ctx, shared_tmp):
    state = {"key": jax.random.key(3), "x": jnp.ones(4)}
    path = checkpoint.write(ctx, shared_tmp, snapshot(state))
    loaded = checkpoint.load(ctx, path, jax.eval_shape(lambda: state))
    assert jax.dtypes.issubdtype(loaded.state["key"].dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(loaded.state["key"]), jax.random.key_data(state["key"]))
    # and it draws the same numbers
    assert np.array_equal(jax.random.uniform(loaded.state["key"], (3,)), jax.random.uniform(state["key"], (3,)))


def test_flipped_bit_is_found_on_every_rank(ctx, shared_tmp):
    import h5py

    state = tree()
    path = checkpoint.write(ctx, shared_tmp, snapshot(state), layout=SMALL_BLOCKS)
    if ctx.is_root:
        with h5py.File(path, "r") as f:
            offset = f["state/big"].id.get_offset()
        with open(path, "r+b") as fh:  # one bit, deep inside the last rank's share of "big"
            fh.seek(offset + state["big"].nbytes - 100)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0x10]))
    ctx.comm_ctl.Barrier()
    with pytest.raises(checkpoint.CheckpointDamaged, match="checksum mismatch in '/state/big'"):
        checkpoint.load(ctx, path, template_of(state))
    if ctx.is_root:
        assert "checksum mismatch" in checkpoint.verify_file(path).problem


def test_truncated_file_is_damaged_not_a_crash(ctx, shared_tmp):
    state = tree()
    path = checkpoint.write(ctx, shared_tmp, snapshot(state))
    if ctx.is_root:
        os.truncate(path, path.stat().st_size // 2)
    ctx.comm_ctl.Barrier()
    with pytest.raises(checkpoint.CheckpointDamaged):
        checkpoint.read_header(ctx, path)
    with pytest.raises(checkpoint.CheckpointDamaged):
        checkpoint.load(ctx, path, template_of(state))


class FullDiskOnLastWriter(checkpoint.Layout):
    """The block writes of the last rank that writes fail as on a full disk (the checksum comes
    right after each): the last rank with parallel HDF5, rank 0 when it writes alone."""

    def crc(self, arr, rows, block):
        from hpcevo.provenance import parallel_hdf5

        last = MPI.COMM_WORLD.size - 1 if parallel_hdf5() else 0
        if MPI.COMM_WORLD.rank == last:
            raise OSError(28, "No space left on device")
        return super().crc(arr, rows, block)


@pytest.fixture(params=["as built", "serial"])
def hdf5_mode(request, monkeypatch):
    """Each checkpoint test that takes this runs twice: with the h5py the suite has (parallel, as
    scripts/setup.sh builds it), and as on a machine whose h5py has no MPI (a GPU node's image),
    where rank 0 writes alone."""
    if request.param == "serial":
        import hpcevo.provenance

        monkeypatch.setattr(hpcevo.provenance, "parallel_hdf5", lambda: False)
    return request.param


def test_failed_write_on_one_rank_fails_all_and_keeps_the_previous(ctx, shared_tmp, hdf5_mode):
    state = tree()
    good = checkpoint.write(ctx, shared_tmp, snapshot(state, 10), layout=SMALL_BLOCKS)
    before = good.read_bytes() if ctx.is_root else None
    failing = FullDiskOnLastWriter(SMALL_BLOCKS.block_bytes, SMALL_BLOCKS.split_min_bytes)
    with pytest.raises(CheckpointError, match="No space left on device"):
        checkpoint.write(ctx, shared_tmp, snapshot(state, 20), layout=failing)
    ctx.comm_ctl.Barrier()
    if ctx.is_root:
        assert sorted(p.name for p in shared_tmp.iterdir()) == ["gen-000000010.h5"]  # no partial left
        assert good.read_bytes() == before
        assert checkpoint.verify_file(good).problem is None


def test_without_parallel_hdf5_rank_0_writes_the_file_every_rank_reads(ctx, shared_tmp, monkeypatch):
    """h5py without MPI: rank 0 writes alone, the other ranks write nothing and take part in every
    agreement; the file holds the same datasets, values and checksum tables as a parallel write's,
    and every rank loads it."""
    import h5py

    import hpcevo.provenance

    state = tree(3)
    parallel = checkpoint.write(ctx, shared_tmp / "parallel", snapshot(state, 10), layout=SMALL_BLOCKS)
    monkeypatch.setattr(hpcevo.provenance, "parallel_hdf5", lambda: False)
    seen = []
    real_file = h5py.File
    monkeypatch.setattr(h5py, "File", lambda *a, **k: seen.append((a[1:2], k)) or real_file(*a, **k))
    serial = checkpoint.write(ctx, shared_tmp / "serial", snapshot(state, 10), layout=SMALL_BLOCKS)
    writes = [s for s in seen if s[0] == ("w",)]
    assert writes == ([(("w",), {})] if ctx.is_root else [])  # rank 0 alone, no MPI-IO driver
    assert all("driver" not in k for _, k in seen)
    loaded = checkpoint.load(ctx, serial, template_of(state))  # every rank reads, without MPI-IO
    assert_same(loaded.state, state)
    if ctx.is_root:
        assert checkpoint.verify_file(serial).problem is None
        with real_file(parallel, "r") as a, real_file(serial, "r") as b:
            names = []
            a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            assert names
            for n in names:
                assert np.array_equal(a[n][()], b[n][()]), n
                assert np.array_equal(a[n].attrs.get("crc32", []), b[n].attrs.get("crc32", [])), n
            assert a.attrs["ranks"] == b.attrs["ranks"] == ctx.size


@pytest.mark.single_process
def test_retention_keeps_newest_and_every_mth(tmp_path):
    for g in (100, 200, 300, 400, 500, 600):
        (tmp_path / checkpoint.file_name(g)).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("untouched")
    checkpoint.prune(tmp_path, keep=2, keep_every=200)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gen-000000200.h5", "gen-000000400.h5", "gen-000000500.h5", "gen-000000600.h5", "notes.txt"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)][:2] == ["gen-000000600.h5", "gen-000000500.h5"]


@pytest.mark.single_process
def test_retention_never_deletes_the_checkpoint_just_written(tmp_path):
    """Checkpoints of later generations in the directory (a loop loaded from an older one and
    saved again, another run's files, a damaged newest one a resume passed over) do not push out
    the one just written: it stays and counts as one of ``keep``."""
    def files():
        return sorted(checkpoint.generation_of(p) for p in checkpoint.list_checkpoints(tmp_path))

    for g in (100, 200, 300, 400):
        (tmp_path / checkpoint.file_name(g)).write_bytes(b"")
    new = tmp_path / checkpoint.file_name(150)
    new.write_bytes(b"")
    checkpoint.prune(tmp_path, keep=2, written=new)
    assert files() == [150, 400]
    checkpoint.prune(tmp_path, keep=1, written=new)
    assert files() == [150]
    for g in (100, 200, 300):
        (tmp_path / checkpoint.file_name(g)).write_bytes(b"")
    checkpoint.prune(tmp_path, keep=2, keep_every=200, written=new)  # (multiples of keep_every stay too)
    assert files() == [150, 200, 300]


def test_a_loop_saved_beside_later_checkpoints_keeps_what_it_saved(ctx, shared_tmp):
    """Loop.save returns a checkpoint that exists and holds the loop, whatever the directory held:
    a loop branched from an older checkpoint of a directory kept at ``keep`` newer ones, and a
    script run again with fewer generations over its last run's directory (examples/api_loop.py
    ended in "is not a file": its own checkpoint, deleted as it was written)."""
    problem = hpcevo.problems.make_problem("rastrigin", 6)
    algo = hpcevo.algorithms.CSO(pop_size=12, dim=6, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algo, problem, ctx).init(seed=4)
    first = loop.advance(10).save(shared_tmp, keep=3)
    for _ in range(2):
        loop.advance(10).save(shared_tmp, keep=3)
    branch = hpcevo.Loop(algo, problem, ctx).load(first).advance(5)  # generation 16, beside 21 and 31
    path = branch.save(shared_tmp, keep=2)
    assert path.is_file() and checkpoint.generation_of(path) == 16
    assert [checkpoint.generation_of(p) for p in checkpoint.list_checkpoints(shared_tmp)] == [31, 16]
    again = hpcevo.Loop(algo, problem, ctx).load(path)
    assert again.digest() == branch.digest()
    assert again.advance(4).digest() == branch.advance(4).digest()
    path = branch.save(shared_tmp, keep=1)  # the newest of its own line, not of the directory's
    assert path.is_file() and [p.name for p in checkpoint.list_checkpoints(shared_tmp)] == [path.name]
    assert hpcevo.Loop(algo, problem, ctx).load(path).digest() == branch.digest()


@pytest.mark.single_process
@pytest.mark.parametrize("text, reason", [
    # h5py's words for an MPI_File_open on a read-only mount (MPICH 4.0's ROMIO, verbatim)
    ("Unable to create file (MPI_File_open failed: MPI error string is 'Read-only file or filesystem "
     "name, error stack:\nADIOI_UFS_OPEN(51): Read access is required to this file')", "Read-only file system"),
    ("MPI error string is 'Not enough space for file , error stack:'", "No space left on device"),
    ("MPI error string is 'Quota exceeded for files'", "Disk quota exceeded"),
    ("MPI error string is 'Access denied to file /x/y.h5'", "Permission denied"),
    ("Unable to synchronously create file (No space left on device)", "No space left on device"),
])
def test_the_reason_behind_an_mpi_io_error_is_the_one_users_search_for(text, reason):
    from hpcevo.checkpoint.format import oserror_text

    assert oserror_text(OSError(text)) == reason


# -- the runner: resume, conflicts, stops --------------------------------------------------------
BASE = {
    "run": {"name": "ck", "seed": 3, "generations": 40},
    "algorithm": {"name": "cso", "pop_size": 13},
    "problem": {"name": "rastrigin", "dim": 6},
    "log": {"every": 10, "progress": "lines"},
    "checkpoint": {"every": 10, "keep": 2, "every_seconds": 0},
}


def cfg_for(out: Path, **sets):
    data = json.loads(json.dumps(BASE))
    data["run"]["out"] = str(out)
    for key, value in sets.items():
        section, name = key.split("__")
        data.setdefault(section, {})[name] = value
    return hpcevo.load_config(data)


def test_resume_equals_uninterrupted_at_another_rank_count(ctx, shared_tmp):
    whole = hpcevo.run(cfg_for(shared_tmp / "whole"), quiet=True, ctx=ctx).summary
    # First part on this job's ranks, stopped at generation 20 by the config...
    first = hpcevo.run(cfg_for(shared_tmp / "split", run__generations=20), quiet=True, ctx=ctx).summary
    assert first["status"] == "complete" and first["generations"] == 20
    # ...continued on one rank alone (rank 0; a different rank count whenever size > 1).
    if ctx.is_root:
        rest = hpcevo.run(cfg_for(shared_tmp / "split"), resume=True, quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        assert rest["resumed_from"] == 20 and rest["generations"] == 40
        assert rest["state_digest"] == whole["state_digest"]
        assert rest["best_fitness"] == whole["best_fitness"]
        gens = [json.loads(x)["generation"] for x in (shared_tmp / "split" / "metrics.jsonl").read_text().splitlines()]
        assert gens == [10, 20, 30, 40]
        # The history in the final checkpoint is per generation and equals the uninterrupted one.
        a = checkpoint.read_history(shared_tmp / "whole" / "checkpoints" / "gen-000000040.h5")
        b = checkpoint.read_history(shared_tmp / "split" / "checkpoints" / "gen-000000040.h5")
        assert len(a["best"]) == 40
        for k in History._fields:
            assert a[k].tobytes() == b[k].tobytes(), k
    ctx.comm_ctl.Barrier()


def test_resume_refuses_a_changed_computation(ctx, shared_tmp):
    hpcevo.run(cfg_for(shared_tmp / "r", run__generations=10), quiet=True, ctx=ctx).summary
    with pytest.raises(UsageError) as e:
        hpcevo.run(cfg_for(shared_tmp / "r", algorithm__pop_size=14), resume=True, quiet=True, ctx=ctx).summary
    assert "algorithm.pop_size: checkpoint has 13, this run has 14" in str(e.value)
    # and without --resume an existing run is never overwritten silently
    with pytest.raises(UsageError, match="resume=True"):
        hpcevo.run(cfg_for(shared_tmp / "r"), quiet=True, ctx=ctx).summary


@pytest.mark.single_process
def test_resume_conflicts_allow_what_keeps_the_state_meaningful(tmp_path):
    text = build.dump(build.resolved(cfg_for(tmp_path)))
    assert resume_conflicts(text, build.resolved(cfg_for(tmp_path / "elsewhere", run__generations=999, log__every=7,
                                                         checkpoint__every=3))) == []
    got = resume_conflicts(text, build.resolved(cfg_for(tmp_path, run__seed=4, problem__dim=7, algorithm__phi=0.2)))
    assert got == [
        "algorithm.phi: checkpoint has 0.1, this run has 0.2",
        "problem.dim: checkpoint has 6, this run has 7",
        "run.seed: checkpoint has 3, this run has 4",
    ]


@pytest.mark.ranks(1, 2)
def test_the_default_every_keeps_checkpoints_to_a_small_share_of_the_run(ctx, shared_tmp, monkeypatch):
    """checkpoint.every left at its default (1,000) writes the first one on schedule, then none
    sooner than 20x the last one's writing time after it; the final one is written. Set
    explicitly, every multiple is written. Every rank agrees. (The checkpoint clock stands still
    here, as if generations were free: whether a real run skips depends on its speed.)"""
    from types import SimpleNamespace

    from hpcevo.driver import stopping

    monkeypatch.setattr(stopping, "time", SimpleNamespace(monotonic=lambda: 1000.0, time=time.time))

    def gens_written(out, **sets):
        data = json.loads(json.dumps(BASE))
        data["run"].update(out=str(out), generations=6000)
        data["log"]["every"] = 500
        data["checkpoint"] = {"keep": 100, "every_seconds": 0, **sets}
        hpcevo.run(hpcevo.load_config(data), quiet=True, ctx=ctx)
        got = sorted(int(p.stem.split("-")[1]) for p in checkpoint.list_checkpoints(out / "checkpoints"))
        assert ctx.comm_ctl.allgather(got) == [got] * ctx.size
        return got

    assert gens_written(shared_tmp / "set", every=1000) == [1000, 2000, 3000, 4000, 5000, 6000]
    assert gens_written(shared_tmp / "default") == [1000, 6000]


@pytest.mark.single_process
def test_a_checkpoint_too_soon_is_skipped_only_by_generation_count():
    from hpcevo.driver.policy import CheckpointPolicy

    p = CheckpointPolicy(every=100, final=True, generations=1000, last=0)
    assert p.due(100, stopping=False, time_due=False) and not p.due(100, stopping=False, time_due=False, soon=True)
    assert p.due(100, stopping=True, time_due=False, soon=True)  # a stop always writes
    assert p.due(150, stopping=False, time_due=True, soon=True)  # so does checkpoint.every_seconds
    assert p.due(1000, stopping=False, time_due=False, soon=True)  # and the end (final)
    assert not p.due(150, stopping=False, time_due=False)


@pytest.mark.single_process
def test_stop_control_says_soon_within_the_share(monkeypatch):
    from hpcevo.driver import stopping
    from hpcevo.driver.stopping import StopControl

    clock = [100.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    ctx = context_for(MPI.COMM_SELF)
    limited, free = (StopControl(ctx, StopFlag(), Deadline(None, 0.0, ""), 0.0, share) for share in (0.05, 0.0))
    assert not limited.poll(8).soon  # nothing written yet: nothing to measure
    for s in (limited, free):
        s.checkpoint_written(2.0)
    clock[0] += 39.0  # 39 s after a 2 s write: 5% of the time would be 40 s
    assert limited.poll(8).soon and not free.poll(8).soon
    clock[0] += 1.5
    assert not limited.poll(8).soon


class OneRankSignalled(StopFlag):
    """Only the last rank 'receives' SIGUSR1, right away: the others must learn it and stop at the
    same generation."""

    def install(self):
        super().install()
        if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
            self.signum = signal.SIGUSR1
        return self


def test_a_signal_on_one_rank_stops_all_with_a_checkpoint(ctx, shared_tmp):
    out = shared_tmp / "sig"
    s = hpcevo.run(cfg_for(out, run__generations=1000), quiet=True, ctx=ctx, stop=OneRankSignalled()).summary
    assert s["status"] == "stopped" and s["generations"] == 1  # agreed at the first boundary
    assert ctx.comm_ctl.allgather(s["state_digest"]) == [s["state_digest"]] * ctx.size
    assert not (out / "summary.json").exists()
    # the stop checkpoint resumes to the same end as a run never stopped
    done = hpcevo.run(cfg_for(out), resume=True, quiet=True, ctx=ctx).summary
    whole = hpcevo.run(cfg_for(shared_tmp / "whole"), quiet=True, ctx=ctx).summary
    assert done["status"] == "complete" and done["state_digest"] == whole["state_digest"]


def test_deadline_inside_the_margin_stops_with_a_checkpoint(ctx, shared_tmp):
    out = shared_tmp / "late"
    # 10 minutes left but a 1-hour margin: due at the first boundary, on every rank.
    s = hpcevo.run(cfg_for(out, run__generations=1000, checkpoint__margin_seconds=3600.0), quiet=True,
                deadline="10m", ctx=ctx).summary
    assert s["status"] == "stopped" and s["generations"] == 1
    assert Path(s["checkpoint"]).name == checkpoint.file_name(1)
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["gen-000000001.h5"]


@pytest.mark.single_process
def test_deadline_parsing():
    now = 1_000_000.0
    assert parse_deadline(90, now) == now + 90
    assert parse_deadline("90m", now) == now + 5400
    assert parse_deadline("1.5h", now) == now + 5400
    assert parse_deadline("01:30:00", now) == now + 5400
    assert parse_deadline("1-00:00:10", now) == now + 86410
    assert parse_deadline("30:00", now) == now + 1800  # MM:SS as Slurm writes short limits
    assert parse_deadline("2026-11-23T18:00:00+00:00", now) == 1795456800.0
    for bad in ("soon", "-5", 0, True):
        with pytest.raises(ValueError):
            parse_deadline(bad, now)


@pytest.mark.single_process
def test_deadline_leaves_room_for_a_chunk_and_a_checkpoint():
    d = Deadline(at=1000.0, margin=60.0)
    assert not d.due(now=900.0)
    d.note_chunk(10.0)
    d.note_checkpoint(15.0)
    assert not d.due(now=889.0)  # 111 s left > 60 + 2 * 25
    assert d.due(now=891.0)
    assert not Deadline(None, 60.0).due()


@pytest.mark.single_process
def test_stop_flag_records_the_first_signal_and_second_sigint_interrupts():
    # Whatever SIGINT's handler was (a job started in the background by a shell ignores it) is
    # what StopFlag must put back.
    before = signal.getsignal(signal.SIGINT)
    with StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert flag.signum == signal.SIGUSR1
    with StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert flag.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before
