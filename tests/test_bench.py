"""drift bench: the alpha-beta fit, the projection model, the bisection, the rank runner's failure
handling, and every subcommand end to end at a tiny size (fresh Gloo ranks, as the command runs)."""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import pytest
import torch

from drift import cost
from drift.bench import capacity, cli, comm
from drift.jobs import launch
from drift.jobs.launch import MemoryCapExceeded, RankError, run_ranks, set_rank_threads

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_fit_recovers_alpha_and_beta_from_model_times():
    truth = cost.Fit(alpha_s=3e-5, beta_s_per_byte=2e-10)
    for kind in comm.KINDS:
        points = [(p, n, truth.predict(kind, p, n)) for p in (2, 4, 8) for n in (2**16, 2**20, 2**26)]
        fit = cost.fit_alpha_beta(kind, points)
        assert fit.alpha_s == pytest.approx(truth.alpha_s, rel=1e-9)
        assert fit.beta_s_per_byte == pytest.approx(truth.beta_s_per_byte, rel=1e-9)
        assert max(comm.rel_errors(fit, kind, points)) < 1e-9


def test_fit_recovers_the_threshold_model():
    truth = cost.Fit(alpha_s=3e-5, beta_s_per_byte=2e-10, gamma_s=1e-4, threshold_bytes=2**16)
    sizes = [2**k for k in range(15, 25)]
    rows = [
        {"kind": kind, "ranks": p, "bytes": n, "seconds": {"mean": truth.predict(kind, p, n)}}
        for kind in comm.KINDS
        for p in (2, 4)
        for n in sizes
    ]
    assert comm.choose_threshold(rows) == 2**16
    model = comm.fits_from_sweep(rows)
    assert model["threshold_bytes"] == 2**16 and model["without_threshold"]["within_25_percent"] < len(rows)
    for kind in comm.KINDS:
        for p in (2, 4):
            fit = comm.model_for(model, kind, p)
            assert (fit.alpha_s, fit.beta_s_per_byte, fit.gamma_s) == pytest.approx((3e-5, 2e-10, 1e-4), rel=1e-8)
            assert model["fits_per_ranks"][kind][str(p)]["within_25_percent"] == len(sizes)
            assert comm.model_for(json.loads(json.dumps(model)), kind, p) == fit  # the JSON gives the same model
        assert model["fits"][kind]["max_rel_error"] < 1e-8  # the same machine at every P: one fit holds
    unmeasured = comm.model_for(model, "all_reduce", 8)  # P = 8 was not swept: the fit over all P
    assert unmeasured.alpha_s == model["fits"]["all_reduce"]["alpha_s"]
    assert comm.model_for(model, "broadcast", 2) is None


def test_no_threshold_for_plain_alpha_beta_times():
    # Exact and 5%-noisy alpha-beta times: the extra gamma per fit never pays for itself.
    truth = cost.Fit(alpha_s=3e-5, beta_s_per_byte=2e-10)
    rng = np.random.default_rng(0)
    for noise in (0.0, 0.05):
        rows = [
            {"kind": kind, "ranks": p, "bytes": n, "seconds": {"mean": truth.predict(kind, p, n) * (1 + noise * e)}}
            for kind in comm.KINDS
            for p in (2, 4)
            for n, e in zip([2**k for k in range(15, 25)], rng.standard_normal(10), strict=True)
        ]
        assert comm.choose_threshold(rows) is None
        fit = comm.model_for(comm.fits_from_sweep(rows), "all_reduce", 2)
        assert fit.gamma_s == 0 and fit.threshold_bytes is None


def test_non_negative_least_squares_matches_scipy():
    from scipy.optimize import nnls

    rng = np.random.default_rng(0)
    for _ in range(200):
        a = rng.standard_normal((9, 3))
        b = rng.standard_normal(9)
        mine, reference = cost.non_negative_lstsq(a, b), nnls(a, b)[0]
        assert mine.min() >= 0
        assert np.sum((a @ mine - b) ** 2) == pytest.approx(np.sum((a @ reference - b) ** 2), rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(mine, reference, atol=1e-9)


def test_fit_keeps_alpha_and_beta_non_negative():
    # Times falling with size would need a negative beta: the fit drops it and keeps a latency.
    times = [1e-3 / (1 + i) for i in range(3)]
    points = [(2, n, t) for n, t in zip((2**16, 2**20, 2**24), times, strict=True)]
    steps, wire = np.array([cost.terms("all_reduce", p, n) for p, n, _ in points]).T
    assert steps.tolist() == [2.0] * 3 and wire.tolist() == [2**16, 2**20, 2**24]  # 2(P-1) steps, 2(P-1)/P n sent
    free = np.linalg.lstsq(np.stack([steps, wire], 1) / np.array(times)[:, None], np.ones(3), rcond=None)[0]
    assert free[1] < 0  # unconstrained, the relative-error fit wants a negative beta
    fit = cost.fit_alpha_beta("all_reduce", points)
    # Alone, alpha minimises sum (2 alpha / t_i - 1)^2 over t_i = 1e-3 / (1 + i): alpha = sum(1 / t_i) /
    # (2 sum(1 / t_i^2)) = 6e3 / (2 x 14e6) = 3 / 14000 s.
    assert fit.alpha_s == pytest.approx(3 / 14000, rel=1e-12) and fit.beta_s_per_byte == 0


def test_ring_terms():
    n = 1 << 20
    assert cost.terms("all_reduce", 4, n) == (6.0, 1.5 * n)
    assert cost.terms("all_gather", 4, n) == (3.0, 0.75 * n)
    assert cost.terms("all_to_all", 1, n) == (0.0, 0.0)


def test_paper_preset_reproduces_the_papers_drift_communication():
    # The preset is derived from DRIFT's 5.1 ms (P = 4) and 20 ms (P = 32) per block (section VI-E).
    fit = cost.PAPER.within_host
    paper = (comm.PAPER.alpha_s, comm.PAPER.beta_s_per_byte, comm.PAPER.flops_per_s)
    assert paper == (fit.alpha_s, fit.beta_s_per_byte, cost.PAPER.matmul_flops_per_s)  # the projection's platform
    n = 20 * 16**4 * 8
    for size, ms in ((4, 5.1), (32, 20.0)):
        modelled = fit.predict("all_reduce", size, n) + fit.predict("all_gather", size, n)
        assert modelled * 1e3 == pytest.approx(ms, rel=0.02)


def test_projection_grids_and_ratios():
    shape, modes = (128, 128, 128, 30), (8, 8, 8, 16)
    rows = [comm.project_block(comm.PAPER, shape, modes, 20, p) for p in (4, 32, 1024)]
    assert [math.prod(r["grid"]) for r in rows] == [4, 32, 1024]
    assert rows[0]["grid"] == (4, 1, 1, 1) and rows[1]["grid"] == (16, 2, 1, 1)  # the paper's pencil at 32
    assert all(r["grid"][-1] == 1 for r in rows)
    for r in rows:
        assert all(math.isfinite(r[m][k]) and r[m][k] > 0 for m in ("drift", "dfno") for k in ("compute_s", "comm_s"))
        assert r["ratio"] == pytest.approx(r["dfno"]["total_s"] / r["drift"]["total_s"])
    # drift's payload does not depend on the grid; dfno's shrinks with the block.
    assert rows[2]["drift"]["comm_s"] > rows[0]["drift"]["comm_s"]
    assert rows[2]["dfno"]["comm_s"] < rows[0]["dfno"]["comm_s"]


def test_reduction_mesh_shapes_and_their_model():
    assert cost.factorisations(1) == [()]
    assert sorted(cost.factorisations(12)) == sorted(
        [(12,), (2, 6), (6, 2), (3, 4), (4, 3), (2, 2, 3), (2, 3, 2), (3, 2, 2)]
    )
    assert len(cost.factorisations(1024)) == 2**9  # the compositions of 10
    assert all(math.prod(s) == 1024 and min(s) >= 2 for s in cost.factorisations(1024))
    n = 10 * 2**20
    fit = cost.Fit(1e-4, 2e-10)
    flat = fit.predict("reduce_scatter", 32, n) + fit.predict("all_gather", 32, n)
    assert cost.reduction_seconds(fit, (32,), n) == pytest.approx(flat)
    # Every shape sends the flat collectives' bytes; the latency is sum(P_i - 1) steps each way.
    for shape in ((4, 8), (8, 4), (2, 2, 2, 2, 2)):
        bytes_only = cost.reduction_seconds(cost.Fit(0.0, 2e-10), shape, n)
        assert bytes_only == pytest.approx(cost.reduction_seconds(cost.Fit(0.0, 2e-10), (32,), n))
        steps = cost.reduction_seconds(cost.Fit(1e-4, 0.0), shape, n) / 1e-4
        assert steps == pytest.approx(2 * sum(p - 1 for p in shape))
    assert cost.best_reduction(fit, 32, n) == ((2, 2, 2, 2, 2), pytest.approx(cost.reduction_seconds(fit, (2,) * 5, n)))
    assert cost.best_reduction(cost.Fit(0.0, 2e-10), 32, n)[0] == (32,)  # no latency: one level is enough
    assert cost.best_reduction(fit, 1, n) == ((), 0.0)


def test_projection_keeps_drift_ahead_of_dfno_to_1024_ranks():
    """The paper preset with the hierarchical reduction: drift ahead of dfno for P = 4..1024."""
    shape, modes = (128, 128, 128, 30), (8, 8, 8, 16)
    for size in (4, 8, 16, 32, 64, 128, 256, 512, 1024):
        row = comm.project_block(comm.PAPER, shape, modes, 20, size)
        assert math.prod(row["reduction"]) == size and row["ratio"] > 1, (size, row["ratio"])
        assert row["drift"]["comm_s"] <= row["drift"]["unfactorised_comm_s"]
    # One level per split dim (16 x 16 x 4), its latency alone puts drift behind.
    assert row["drift"]["unfactorised_comm_s"] > row["dfno"]["total_s"]


def test_drift_reduction_pads_as_the_shares_do():
    """16 first-mode rows over a 16 x 2 pencil: 16 rows over the first dim, then the 1-row share
    padded to 2 rows over the second; ring bytes (P_i - 1) / P_i of each payload, each way."""
    row, beta = 1000.0, 1e-9
    shape, seconds = cost.drift_reduction(cost.Fit(0.0, beta), [16, 2], 16, row)
    assert math.prod(shape) == 32 and seconds == pytest.approx(2 * beta * row * (15 + 1))
    shape, seconds = cost.drift_reduction(cost.Fit(1.0, 0.0), [16, 2], 16, row)
    assert shape == (2, 2, 2, 2, 2) and seconds == pytest.approx(2 * 5)
    assert cost.drift_reduction(cost.Fit(1.0, 0.0), [16, 2], 16, row, factorise=False) == ((16, 2), 2 * (15 + 1))


def test_cluster_option():
    assert comm.parse_cluster("paper") is comm.PAPER
    custom = comm.parse_cluster("1e-6,1e-10,1e13")
    assert (custom.alpha_s, custom.beta_s_per_byte, custom.flops_per_s) == (1e-6, 1e-10, 1e13)
    for bad in ("fast", "1,2", "1,-1,3", "1,1,0"):
        with pytest.raises(argparse.ArgumentTypeError):
            comm.parse_cluster(bad)


def test_bisect_finds_the_largest_fitting_value():
    tried = []

    def fits(m):
        tried.append(m)
        return m <= 11, {"m": m}

    best, records = capacity.bisect(fits, 1, 40)
    assert best == 11 and [r["m"] for r in records] == tried and len(tried) <= 6
    assert capacity.bisect(lambda m: (False, {}), 3, 9)[0] is None


def _fail_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one fails")
    dist.barrier()  # rank 0 waits in a collective its peer never joins


def _allocate(gigabytes: float):
    import torch

    return torch.ones(int(gigabytes * 1e9 / 4)).sum().item()


def _threads() -> int:
    return torch.get_num_threads()


def test_threads_option_reaches_both_launchers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        with set_rank_threads(1):
            assert run_ranks(1, _threads, timeout_s=60) == [1]
            with launch.process_group("cpu"):  # drift train's ranks (here one, in this process)
                assert torch.get_num_threads() == 1
        assert "OMP_NUM_THREADS" not in os.environ
        assert run_ranks(1, _threads, timeout_s=60) == [launch.cores()]
    finally:
        torch.set_num_threads(before)


def test_runner_failures_are_errors_not_hangs():
    start = time.monotonic()
    with pytest.raises(RankError, match="^rank 1 failed: ValueError: rank one fails"):
        run_ranks(2, _fail_on_rank_one, timeout_s=60, group_timeout_s=20)
    with pytest.raises(MemoryCapExceeded):
        run_ranks(1, _allocate, 1.0, memory_cap_gb=0.5, timeout_s=60)
    assert time.monotonic() - start < 60


COMPLEX64 = 8  # bytes of one value of a float32 field's spectrum


def _layer_collectives(method: str, shape, modes, channels: int, size: int) -> list[list]:
    """``[kind, payload bytes, ranks]`` of the collectives one spectral layer's forward issues on rank 0 (whose
    calls the benchmarks report) of a slab of ``size`` ranks (the first dim split evenly), batch 1,
    ``channels`` in and out, real fields with ``modes`` (ints: 2k kept on the leading dims, k on the last)."""
    if size == 1:
        return []
    kept = (*(2 * k for k in modes[:-1]), modes[-1])
    if method == "drift":
        # Every kept mode of this rank's partial spectrum is reduce-scattered (the first mode dim padded
        # to equal shares); its share of the product is all-gathered.
        share, row = -(-kept[0] // size), math.prod(kept[1:]) * channels * COMPLEX64
        return [["reduce_scatter", size * share * row, size], ["all_gather", share * row, size]]
    # A transpose each way swaps the split first dim with the last one, moving this rank's whole block:
    # forward its slab of the first dim after the other dims' transforms, back the whole first dim and
    # rank 0's torch.chunk of the last dim's outputs. Those outputs: dfno's the half spectrum, dfno-pruned's
    # the kept modes.
    out = (*shape[1:-1], shape[-1] // 2 + 1) if method == "dfno" else kept[1:]
    forward = shape[0] // size * math.prod(out)
    back = shape[0] * math.prod(out[:-1]) * -(-out[-1] // size)
    return [["all_to_all", forward * channels * COMPLEX64, size], ["all_to_all", back * channels * COMPLEX64, size]]


def _png_size(path) -> tuple[int, int]:
    """(width, height) in pixels of the PNG at ``path``, from its header (the signature, then IHDR)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _pixels(inches: tuple[float, float]) -> tuple[int, int]:
    """The pixels of a figure of ``inches`` saved at the plots' 110 dpi."""
    return round(inches[0] * 110), round(inches[1] * 110)


def _run(tmp_path, name, *argv):
    out = tmp_path / name
    assert cli.main([name, *argv, "--out", str(out)]) == 0
    data = json.loads((out / f"{name}.json").read_text())
    assert data["command"] == name and data["machine"]["cores"] >= 1
    assert (out / f"{name}.md").exists()
    return data, out


def test_bench_comm(tmp_path, capsys):
    data, out = _run(
        tmp_path,
        "comm",
        *("--nproc", "2", "--sizes-kib", "64", "1024", "--warmup", "1", "--iters", "2"),
        *("--fno-shape", "16x16x16x30", "--fno-ranks", "2", "--fno-iters", "1", "--modes", "4", "4", "4", "4"),
        *("--project-ranks", "4", "64"),
    )
    # A row for every collective and size asked for (the whole vector's bytes), each of 2 rounds.
    cases = sorted((r["kind"], r["ranks"], r["bytes"]) for r in data["sweep"])
    assert cases == sorted((kind, 2, kib * 1024) for kind in comm.KINDS for kib in (64, 1024))
    for r in data["sweep"]:
        s = r["seconds"]
        assert s["n"] == 2 and 0 < s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"], s
        assert s["min"] <= s["mean"] <= s["max"], s
    threshold = data["threshold_bytes"]
    assert threshold is None or 1024 <= threshold < 1024 * 1024 // 2
    for fit in [*data["fits"].values(), *(f for per in data["fits_per_ranks"].values() for f in per.values())]:
        assert min(fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s"]) >= 0
        assert fit["threshold_bytes"] == threshold and math.isfinite(fit["max_rel_error"])
    assert data["without_threshold"]["points"] == len(data["sweep"])
    kinds = {(r["method"], r["kind"]) for r in data["fno"]}
    assert kinds == {("drift", "reduce_scatter"), ("drift", "all_gather"), ("dfno", "all_to_all")}
    for r in data["fno"]:
        # The FNO's 4 spectral layers (width 20) on 2 ranks: per kind, their calls and payload bytes.
        mine = [c for c in _layer_collectives(r["method"], (16, 16, 16, 30), (4, 4, 4, 4), 20, 2) if c[0] == r["kind"]]
        assert (r["calls"], r["bytes"]) == (4 * len(mine), 4 * sum(c[1] for c in mine)), r
        assert math.isfinite(r["model_s"] / r["measured_s"])
        assert 0 < r["last_arrival_s"] <= r["measured_s"]
    assert [r["ranks"] for r in data["projection"]] == [4, 64] and data["cluster"]["name"] == "paper"
    assert [tuple(r["reduction"]) for r in data["projection"]] == [(2, 2), (2,) * 6]
    # A panel of 4 x 3.4 inches per collective; the projection 5 x 3.6 inches.
    assert _png_size(out / "comm_fit.png") == _pixels((4 * len(comm.KINDS), 3.4)) == (1760, 374)
    assert _png_size(out / "projection.png") == _pixels((5, 3.6)) == (550, 396)
    assert "PROJECTION" in capsys.readouterr().out


def test_bench_scaling(tmp_path):
    data, out = _run(
        tmp_path,
        "scaling",
        *("--nproc", "2", "--shape", "16x16x8x6", "--local", "8x16x8x6", "--modes", "4", "4", "4", "3"),
        *("--warmup", "1", "--iters", "2", "--width", "4", "--threads", "1"),
    )
    assert data["config"]["threads"] == 1
    rows = data["rows"]
    assert {(r["scaling"], r["method"]) for r in rows} == {
        (s, m) for s in ("strong", "weak") for m in ("drift", "dfno", "dfno-pruned")
    }
    assert all(r["completed"] and r["forward"]["n"] == 2 and r["backward"]["n"] == 2 for r in rows)
    assert all(r["ranks"] == 2 and len(r["peak_gb_per_rank"]) == 2 for r in rows)
    assert {tuple(r["shape"]) for r in rows if r["scaling"] == "weak"} == {(16, 16, 8, 6)}
    for r in rows:
        # One block forward's collectives, with the payload bytes its shapes give (the same grid both ways).
        assert r["collectives"] == _layer_collectives(r["method"], (16, 16, 8, 6), (4, 4, 4, 3), 4, 2), r
        assert r["payload_bytes"] == sum(c[1] for c in r["collectives"])
    for kind in ("strong", "weak"):  # forward and backward: 2 panels of 4.5 x 3.6 inches
        assert _png_size(out / f"scaling_{kind}.png") == _pixels((2 * 4.5, 3.6)) == (990, 396)


def test_bench_modes_and_phases(tmp_path):
    data, out = _run(
        tmp_path, "modes", "--nproc", "2", "--k", "2", "4", "--shape", "16x16x8x6", "--iters", "2", "--width", "4"
    )
    rows = data["rows"]
    assert [(r["ranks"], r["k"], r["method"]) for r in rows] == [(2, k, m) for k in (2, 4) for m in ("drift", "dfno")]
    for r in rows:
        # k modes on every dim (within what 16 x 16 x 8 x 6 has), and the block's collectives for them.
        assert r["completed"] and r["modes"] == [r["k"]] * 4 and r["forward"]["n"] == 2
        assert r["collectives"] == _layer_collectives(r["method"], (16, 16, 8, 6), r["modes"], 4, 2), r
        assert r["payload_bytes"] == sum(c[1] for c in r["collectives"])
    payload = {(r["k"], r["method"]): r["payload_bytes"] for r in rows}
    assert payload[(4, "drift")] > payload[(2, "drift")]  # drift's payload grows with k, dfno's does not
    assert payload[(4, "dfno")] == payload[(2, "dfno")]
    assert _png_size(out / "modes_P2.png") == _pixels((4.5, 3.6)) == (495, 396)  # the forward's panel alone
    data, out = _run(
        tmp_path, "phases", "--nproc", "1", "2", "--shape", "16x16x8x6", "--modes", "4", "4", "4", "3", "--iters", "2"
    )
    methods = ["drift", "dfno", "dfno-pruned"]
    assert [(r["ranks"], r["method"]) for r in data["rows"]] == [(p, m) for p in (1, 2) for m in methods]
    for r in data["rows"]:
        phases = r["phases_s"]
        assert r["completed"] and r["forward"]["n"] == 2
        assert set(data["phases"]) <= set(phases) | {"other"}
        # The whole FNO (4 layers, width 20): each layer's collectives, none on one rank.
        layer = _layer_collectives(r["method"], (16, 16, 8, 6), (4, 4, 4, 3), 20, r["ranks"])
        assert r["collectives"] == layer * 4 and r["payload_bytes"] == 4 * sum(c[1] for c in layer), r
        assert phases["lift+projection"] > 0 and (phases["collectives"] > 0) == (r["ranks"] > 1)
        if r["ranks"] == 1:
            # Each pass's phases sum to its time ("other" is the rest), so the median phases of 2 passes
            # (their means) sum to the median forward; on P ranks the phases are the ranks' mean, the
            # forward rank 0's.
            assert sum(phases.values()) == pytest.approx(r["forward"]["median"], rel=1e-9)
    # The heat map: 1.4 inches a phase (6) + 2 wide, 0.45 a row (6) + 1.5 high.
    assert _png_size(out / "phases.png") == _pixels((1.4 * 6 + 2, 0.45 * 6 + 1.5)) == (1144, 462)


def test_bench_capacity(tmp_path):
    data, out = _run(
        tmp_path,
        "capacity",
        *("--dims", "2", "--nproc", "1", "--methods", "drift", "--memory-gb", "2"),
        *("--step-2d", "64", "--max-n-2d", "128"),
    )
    (row,) = data["rows"]
    assert row["dims"] == 2 and row["largest_n"] == 128 and row["largest_shape"] == [128, 128]
    assert all(t["fits"] and t["peak_gb_total"] < 2 for t in row["trials"])
    # Beside the row: points per GB of the summed peak, the floor and the estimate per rank (start-up in both).
    assert row["points_per_gb"] == pytest.approx(128 * 128 / row["trials"][-1]["peak_gb_total"], rel=0.5)
    assert 0.25 < row["floor_gb_per_rank"] < row["estimate_gb_per_rank"] < 1
    assert _png_size(out / "capacity.png") == _pixels((5.5, 3.8)) == (605, 418)
    data, _ = _run(
        tmp_path,
        "capacity",
        *("--dims", "4", "--nproc", "1", "--methods", "drift", "--memory-gb", "8", "--passes", "train"),
        *("--step", "32", "--max-n", "32", "--recompute"),
    )
    (row,) = data["rows"]
    assert row["recompute"] and row["largest_n"] == 32 and row["estimate_gb_per_rank"] > row["floor_gb_per_rank"]
    data, _ = _run(
        tmp_path,
        "capacity",
        *("--dims", "2", "--nproc", "1", "--methods", "drift", "--memory-gb", "0.01"),
        *("--step-2d", "64", "--max-n-2d", "64"),
    )
    (row,) = data["rows"]
    assert row["largest_n"] is None and "cap" in row["trials"][0]["error"]


def test_bad_options_are_one_line_errors(capsys):
    with pytest.raises(SystemExit):
        cli.main(["scaling", "--nproc", "0"])
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["comm", "--cluster", "fast"])
    assert "--cluster must be" in capsys.readouterr().err
    # Modes that do not fit the grid: an error before any rank starts.
    assert cli.main(["scaling", "--shape", "8x8x8x6", "--nproc", "1"]) == 2
    assert "modes (8, 8, 8, 16) on grid 8x8x8x6" in capsys.readouterr().out


def test_train_refuses_a_missing_gpu_before_generating_data(monkeypatch, tmp_path, capsys):
    """``drift train --device cuda`` without a GPU and without data: the option's error at once, before the
    default data set is generated (on the device it names)."""
    from drift.cli import main as drift

    monkeypatch.setenv("DRIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert drift(["train", "--device", "cuda", "--out", str(tmp_path / "run")]) == 2
    assert "--device cuda: no CUDA device is available" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_cuda_needs_one_gpu_per_rank_it_starts(monkeypatch, capsys):
    from drift.errors import PlanError
    from drift.train import ConfigError, TrainConfig, check_config

    for gpus in (0, 1):
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        # Ranks drift starts itself see every GPU and need one each: an error before any rank starts.
        assert cli.main(["comm", "--device", "cuda", "--nproc", "2", "--fno-ranks", "4"]) == 2
        error = f"drift bench: error: --device cuda: 4 ranks need 4 GPUs (one each), found {gpus}"
        assert capsys.readouterr().err.strip() == error
        with pytest.raises(RankError, match=rf"^2 ranks on CUDA need 2 GPUs \(one each, for NCCL\), found {gpus}$"):
            run_ranks(2, _threads, device="cuda")
        message = "no CUDA device is available" if gpus == 0 else "2 ranks on this machine need 2 GPUs, found 1"
        with pytest.raises(ConfigError, match=f"--device cuda: {message}"):
            check_config(TrainConfig(device="cuda"), 2)
    # Ranks a launcher placed (torchrun, a scheduler showing each rank its own GPU) need only a GPU.
    with monkeypatch.context() as env:
        for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
            env.setenv(name, value)
        check_config(TrainConfig(device="cuda"), 2)  # one GPU visible
        env.setattr(torch.cuda, "device_count", lambda: 0)
        with pytest.raises(ConfigError, match="--device cuda: no CUDA device is available"):
            check_config(TrainConfig(device="cuda"), 2)
        with pytest.raises(PlanError, match="no CUDA device is available"), launch.process_group("cuda"):
            pass
