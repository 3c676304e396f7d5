"""The performance model (hpcevo.model) and `hpcevo model`: pure arithmetic, one process."""

from __future__ import annotations

import math

import pytest

from hpcevo.tools import model
from hpcevo.cli import main

pytestmark = pytest.mark.single_process


def test_alpha_beta_fit_recovers_the_line():
    sizes = [8, 1024, 65536, 1 << 20]
    times = [3e-6 + s * 2e-10 for s in sizes]
    ab = model.fit_alpha_beta(sizes, times)
    assert ab.alpha == pytest.approx(3e-6, rel=1e-9) and ab.beta == pytest.approx(2e-10, rel=1e-9)
    # 5% noise on the largest message must not swamp alpha (a plain least-squares fit gives
    # 1.9 us or 4.1 us here instead of 3 us)
    sizes = [8, 128, 2048, 32768, 524288, 8388608]
    times = [3e-6 + s * 2e-10 for s in sizes]
    for f in (0.95, 1.05):
        assert model.fit_alpha_beta(sizes, times[:-1] + [times[-1] * f]).alpha == pytest.approx(3e-6, rel=0.02)
    with pytest.raises(ValueError):
        model.fit_alpha_beta([1], [1.0])


def test_collective_formulas():
    ab = model.AlphaBeta(alpha=1e-6, beta=1e-9)
    assert ab.allreduce(1, 1e6) == 0 and ab.allgather(1, 1e6) == 0
    # 8 ranks, 1 MB: recursive doubling 3 (a + n b) = 3.003 ms; Rabenseifner 6 a + 2 * 7/8 * n b = 1.756 ms
    assert ab.allreduce(8, 1e6) == pytest.approx(6e-6 + 1.75e-3)
    assert ab.allreduce(8, 8) == pytest.approx(3 * (1e-6 + 8e-9))  # small: recursive doubling wins
    assert ab.allgather(8, 8e6, "ring") == pytest.approx(7e-6 + 7e-3)
    assert ab.allgather(8, 8e6, "recursive_doubling") == pytest.approx(3e-6 + 7e-3)


def test_projection_is_capped_by_the_micro_batches():
    w = model.Workload(pop=1024, eval_s=1e-3, algo_s=0.0)  # 64 micro-batches of 16
    assert (w.microbatches, w.rows) == (64, 16)
    rows = model.project(w, [1, 2, 64, 128], model.AlphaBeta(0.0, 0.0))
    assert rows[0]["efficiency"] == 1.0
    assert rows[1]["efficiency"] == pytest.approx(1.0) and rows[2]["speedup"] == pytest.approx(64)
    assert rows[3]["busy_ranks"] == 64 and rows[3]["speedup"] == pytest.approx(64)  # no gain past k
    # every candidate its own micro-batch: all 1024 ranks busy
    w1 = model.Workload(pop=1024, eval_s=1e-3, microbatch=1)
    assert model.project(w1, [1024], model.AlphaBeta(0.0, 0.0))[0]["speedup"] == pytest.approx(1024)


def test_replicated_algorithm_cost_bounds_the_speedup():
    w = model.Workload(pop=4096, eval_s=1e-4, algo_s=1e-3, microbatch=1)
    (r,) = model.project(w, [4096], model.AlphaBeta(*model.NETWORKS["ib-hdr"]))
    assert r["speedup"] < (w.algo_s + w.pop * w.eval_s) / w.algo_s  # Amdahl
    # one slot of one row per rank, gathered: 4096 * 4 bytes
    assert r["exchange_s"] == pytest.approx(model.AlphaBeta(*model.NETWORKS["ib-hdr"]).allgather(4096, 4096 * 4))
    # uneven: 64 micro-batches over 48 ranks -> 2 slots each, padded bytes are sent too
    w64 = model.Workload(pop=1024, eval_s=1e-4)
    (r48,) = model.project(w64, [48], model.AlphaBeta(1e-6, 1e-9))
    assert r48["exchange_s"] == pytest.approx(model.AlphaBeta(1e-6, 1e-9).allgather(48, 48 * 2 * 16 * 4))


def test_cli(capsys, tmp_path):
    assert main(["model", "--pop", "65536", "--eval-ms", "10", "--ranks", "1", "64", "4096",
                 "--plot", str(tmp_path / "m.png")]) == 0
    out = capsys.readouterr().out
    assert "pop 65536 in 64 micro-batches of 1024" in out
    lines = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("1 ", "64 ", "4096 "))]
    assert [ln[0] for ln in lines] == ["1", "64", "4096"] and lines[2][1] == "64"  # busy ranks
    assert (tmp_path / "m.png").stat().st_size > 10_000
    assert main(["model", "--pop", "100", "--eval-ms", "1", "--network", "carrier-pigeon"]) == 2
    assert "allowed: ib-hdr, ib-edr, eth-25g" in capsys.readouterr().err
    assert math.isfinite(model.AlphaBeta(*model.NETWORKS["eth-25g"]).allreduce(2, 10))
