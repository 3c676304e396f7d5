"""Rank binding under every launcher, with simulated nodes: 1, 2 and 4 GPUs, and CPU-only.

``decide`` is pure: a node is the list of what each of its ranks saw (``probe`` with a
simulated environment, GPU device files, CPU affinity), so no GPU and no launcher are needed.
"""

from __future__ import annotations

import pytest

from hpcevo.errors import UsageError
from hpcevo.parallel import Request, cpu_list, decide
from hpcevo.parallel.binding import COMM_SOURCE, LOCAL_RANK_VARS, probe

# What each launcher puts in rank i's environment (of n on the node); the extra variables are
# the ones that could mislead a naive reader: world ranks, sizes, an outer job's SLURM_LOCALID.
LAUNCHERS = {
    "hydra": lambda i, n: {"MPI_LOCALRANKID": str(i), "MPI_LOCALNRANKS": str(n), "PMI_RANK": str(i + 8)},
    "hydra-in-slurm": lambda i, n: {"MPI_LOCALRANKID": str(i), "SLURM_LOCALID": "0", "SLURM_PROCID": "0"},
    "openmpi": lambda i, n: {"OMPI_COMM_WORLD_LOCAL_RANK": str(i), "OMPI_COMM_WORLD_RANK": str(i + 4)},
    "srun": lambda i, n: {"SLURM_LOCALID": str(i), "SLURM_PROCID": str(i + 4), "PMI_RANK": str(i + 4)},
    "pals": lambda i, n: {"PALS_LOCAL_RANKID": str(i), "PMI_LOCAL_RANK": str(i), "PALS_RANKID": str(i + 4)},
    "cray-pmi": lambda i, n: {"PMI_LOCAL_RANK": str(i), "PMI_RANK": str(i + 4)},
    "mvapich": lambda i, n: {"MV2_COMM_WORLD_LOCAL_RANK": str(i), "MV2_COMM_WORLD_RANK": str(i + 4)},
}
EXPECTED_SOURCE = {
    "hydra": "MPI_LOCALRANKID",
    "hydra-in-slurm": "MPI_LOCALRANKID",
    "openmpi": "OMPI_COMM_WORLD_LOCAL_RANK",
    "srun": "SLURM_LOCALID",
    "pals": "PALS_LOCAL_RANKID",
    "cray-pmi": "PMI_LOCAL_RANK",
    "mvapich": "MV2_COMM_WORLD_LOCAL_RANK",
}

pytestmark = pytest.mark.single_process


def node(launcher: str, n: int, gpus: int = 0, *, visible=None, order=None, cores: int = 16,
         affinity=None, cuda: bool | None = None):
    """Probes of the n ranks of one simulated node, in communicator order.

    visible: CUDA_VISIBLE_DEVICES per local rank (a function of it) or None (unset);
    order: the launcher's local rank of each communicator position (default: the same).
    """
    order = list(range(n)) if order is None else order
    out = []
    for i in order:
        env = LAUNCHERS[launcher](i, n) if launcher != "none" else {}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible(i)
        out.append(probe(
            env,
            device_files=[str(g) for g in range(gpus)],
            affinity=range(cores) if affinity is None else affinity(i),
            cores=cores,
            cuda_runtime=gpus > 0 if cuda is None else cuda,
        ))
    return out


def bind_all(probes, **request):
    return [decide(probes, i, Request(**request)) for i in range(len(probes))]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_one_rank_per_gpu(launcher, gpus):
    bs = bind_all(node(launcher, gpus, gpus))
    assert [b.gpu for b in bs] == [str(g) for g in range(gpus)]
    for i, b in enumerate(bs):
        assert b.kind == "gpu" and b.device == f"cuda:{i}" and b.gpu_source == "local rank"
        assert (b.local_rank, b.local_size, b.local_rank_source) == (i, gpus, EXPECTED_SOURCE[launcher])
        assert b.env == {"CUDA_VISIBLE_DEVICES": str(i)}
        # several processes on one GPU node must not each grab 75% of a GPU up front
        assert b.env_defaults.get("XLA_PYTHON_CLIENT_PREALLOCATE") == ("false" if gpus > 1 else None)
        assert b.threads is None and not b.notes


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_gpu_follows_the_launchers_local_rank_not_the_communicator_order(launcher, gpus):
    order = list(reversed(range(gpus)))
    bs = bind_all(node(launcher, gpus, gpus, order=order))
    assert [b.gpu for b in bs] == [str(i) for i in order]


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_gpus_per_node_list_is_divided(gpus):
    # srun --gpus-per-node=G: every task sees the same list of the node's G GPUs
    listed = ",".join(str(g + 4) for g in range(gpus))
    bs = bind_all(node("srun", gpus, 8, visible=lambda i: listed))
    assert [b.gpu for b in bs] == listed.split(",")


@pytest.mark.parametrize("launcher", ["srun", "pals", "openmpi"])
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_a_binding_made_by_the_scheduler_is_kept(launcher, gpus):
    # srun --gpus-per-task=1 / --gpu-bind=single:1: each task sees exactly its own GPU
    bs = bind_all(node(launcher, gpus, gpus, visible=lambda i: str(gpus - 1 - i)))
    assert [b.gpu for b in bs] == [str(gpus - 1 - i) for i in range(gpus)]
    assert {b.gpu_source for b in bs} == {"scheduler"}
    assert [b.env["CUDA_VISIBLE_DEVICES"] for b in bs] == [b.gpu for b in bs]


def test_scheduler_gave_several_gpus_per_task_first_is_used():
    bs = bind_all(node("srun", 2, 4, visible=lambda i: f"{2 * i},{2 * i + 1}"))
    assert [b.gpu for b in bs] == ["0", "2"]
    assert all("uses the first" in b.notes[0] for b in bs)


def test_gpu_uuids_are_passed_through():
    uuids = "GPU-aaaa-1111,GPU-bbbb-2222"
    bs = bind_all(node("hydra", 2, 2, visible=lambda i: uuids))
    assert [b.env["CUDA_VISIBLE_DEVICES"] for b in bs] == ["GPU-aaaa-1111", "GPU-bbbb-2222"]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("gpus,ranks", [(1, 2), (2, 3), (2, 4), (4, 8)])
def test_more_ranks_than_gpus_is_refused_unless_sharing_is_asked_for(launcher, gpus, ranks):
    probes = node(launcher, ranks, gpus)
    for i in range(ranks):
        with pytest.raises(UsageError) as e:
            decide(probes, i, Request(), host="gpu07")
        msg = str(e.value)
        assert f"{ranks} ranks on gpu07 but {gpus} GPU" in msg
        assert "parallel.share_gpus = true" in msg and "ntasks-per-node" in msg
    bs = bind_all(probes, share_gpus=True)
    assert [b.gpu for b in bs] == [str(i % gpus) for i in range(ranks)]
    assert all(b.gpu_source == "shared" and "share" in b.notes[0] for b in bs)


def test_one_visible_gpu_seen_by_every_rank_is_shared_not_a_scheduler_binding():
    probes = node("hydra", 2, 4, visible=lambda i: "3")
    with pytest.raises(UsageError, match="2 ranks but 1 GPU visible \\(3\\)"):
        decide(probes, 0, Request())
    assert [b.gpu for b in bind_all(probes, share_gpus=True)] == ["3", "3"]


def test_hidden_gpus_and_missing_runtime():
    # CUDA_VISIBLE_DEVICES="" or "-1" hides every GPU: CPU, and 'gpu' is refused
    for hidden in ("", "-1"):
        probes = node("srun", 2, 4, visible=lambda i: hidden)
        assert {b.kind for b in bind_all(probes)} == {"cpu"}
        with pytest.raises(UsageError, match=f"CUDA_VISIBLE_DEVICES={hidden},"):
            decide(probes, 0, Request(device="gpu"))
    # GPUs in /dev but no JAX CUDA plugin: JAX could not use them
    probes = node("srun", 2, 2, cuda=False)
    assert {b.kind for b in bind_all(probes)} == {"cpu"}
    with pytest.raises(UsageError, match="JAX CUDA plugin installed: no.*allowed: 'auto', 'cpu', 'gpu'"):
        decide(probes, 1, Request(device="gpu"))


def test_device_cpu_ignores_gpus():
    bs = bind_all(node("srun", 4, 4), device="cpu")
    assert {b.kind for b in bs} == {"cpu"}
    assert all("CUDA_VISIBLE_DEVICES" not in b.env for b in bs)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_cpu_node_thread_cap(launcher, ranks):
    bs = bind_all(node(launcher, ranks, cores=16))
    for i, b in enumerate(bs):
        assert (b.kind, b.device, b.threads, b.local_rank) == ("cpu", "cpu, 1 thread", 1, i)
        assert b.env == {"NPROC": "1"}
        assert b.env_defaults == {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    # "auto" without a CPU binding: a fair share of the node's cores
    bs = bind_all(node(launcher, ranks, cores=16), threads="auto")
    assert {b.threads for b in bs} == {16 // ranks}
    assert bs[0].env["NPROC"] == str(16 // ranks)


@pytest.mark.parametrize("ranks,per_rank", [(2, 8), (4, 4), (8, 2)])
def test_cpu_binding_from_the_launcher_is_respected(ranks, per_rank):
    # srun --cpu-bind=cores -c K / mpiexec -bind-to core:K: each rank sees its own K CPUs
    bound = lambda i: range(i * per_rank, (i + 1) * per_rank)  # noqa: E731
    bs = bind_all(node("srun", ranks, cores=16, affinity=bound), threads="auto")
    assert [b.threads for b in bs] == [per_rank] * ranks
    assert [b.affinity for b in bs] == [tuple(bound(i)) for i in range(ranks)]
    assert not any(b.notes for b in bs)
    # a fixed thread count above the binding is allowed, and pointed out
    bs = bind_all(node("srun", ranks, cores=16, affinity=bound), threads=per_rank * 2)
    assert all(f"{per_rank * 2} threads on the {per_rank} CPU(s)" in b.notes[0] for b in bs)


def test_cpu_oversubscription_and_overlapping_binding_are_pointed_out():
    bs = bind_all(node("hydra", 4, cores=8), threads=4)
    assert all("4 ranks x 4 threads > 8 cores" in b.notes[0] for b in bs)
    bs = bind_all(node("hydra", 2, cores=8, affinity=lambda i: [0, 1]), threads=1)
    assert all("overlaps with 1 other rank" in b.notes[0] for b in bs)


def test_stale_or_partial_launcher_variables_fall_back_to_the_communicator():
    # an outer batch step's SLURM_LOCALID=0 inherited by every rank of an inner launcher
    probes = node("srun", 3, order=[0, 0, 0])
    assert [decide(probes, i).local_rank for i in range(3)] == [0, 1, 2]
    assert {decide(probes, i).local_rank_source for i in range(3)} == {COMM_SOURCE}
    # a sub-communicator holding ranks 2 and 3 of a node
    probes = node("openmpi", 2, order=[2, 3])
    assert [(b.local_rank, b.local_rank_source) for b in bind_all(probes)] == [(0, COMM_SOURCE), (1, COMM_SOURCE)]
    # no launcher at all (a singleton run)
    (b,) = bind_all(node("none", 1))
    assert (b.local_rank, b.local_size, b.local_rank_source) == (0, 1, COMM_SOURCE)


def test_launcher_precedence():
    # hydra started by srun: the inner launcher's variable wins over the outer one's
    env = {"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    assert probe(env, device_files=[], affinity=[0], cores=1).env_local_rank == ("MPI_LOCALRANKID", 1)
    assert LOCAL_RANK_VARS.index("SLURM_LOCALID") == len(LOCAL_RANK_VARS) - 1


def test_cpu_list():
    assert cpu_list([0, 1, 2, 3, 8, 9, 11]) == "0-3,8-9,11"
    assert cpu_list([5]) == "5" and cpu_list([]) == ""


def test_this_job_is_bound_consistently(ctx):
    """The real job: local ranks on each node are 0..n-1, and the CPU thread cap is applied."""
    import os

    from mpi4py import MPI

    node_comm = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local = sorted(node_comm.allgather(ctx.local_rank))
    finally:
        node_comm.Free()
    assert local == list(range(ctx.local_size))
    assert ctx.local_rank_source in (*LOCAL_RANK_VARS, COMM_SOURCE)
    assert ctx.binding is not None and ctx.binding.kind == "cpu"
    assert os.environ["NPROC"] == "1" == str(ctx.binding.threads)


def test_cpu_ranks_compile_for_one_instruction_set_unless_the_user_chose_one():
    """x86-64 CPU ranks cap XLA at AVX2 (bits then do not depend on which x86 CPU a rank has);
    a cap already in XLA_FLAGS is the user's and stays, other architectures get no flag, and
    GPU ranks get XLA's determinism flag instead (scatters without atomics, the autotuner's first
    choice rather than its fastest: two runs of one seed give the same bits)."""
    (b,) = bind_all(node("hydra", 1))
    assert b.xla_flags == ("--xla_cpu_max_isa=AVX2",)
    mine = probe({"XLA_FLAGS": "--xla_cpu_max_isa=AVX512 --xla_dump_to=/tmp/x"}, device_files=[], affinity=[0],
                 cores=1)
    assert decide([mine], 0).xla_flags == ()
    import dataclasses

    arm = dataclasses.replace(node("hydra", 1)[0], machine="aarch64")
    assert decide([arm], 0).xla_flags == ()
    (g,) = bind_all(node("hydra", 1, gpus=1))
    assert g.kind == "gpu" and g.xla_flags == ("--xla_gpu_deterministic_ops=true",)
    shared = bind_all(node("hydra", 2, gpus=1), share_gpus=True)[1]
    assert shared.xla_flags == g.xla_flags


def test_this_job_caps_the_instruction_set_it_compiles_for(ctx):
    import os
    import platform

    if platform.machine() == "x86_64":
        assert "--xla_cpu_max_isa=" in os.environ.get("XLA_FLAGS", "")
