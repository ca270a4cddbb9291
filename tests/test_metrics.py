"""PDEBench's metrics on sharded fields of 1, 2 and 3 spatial dims equal a numpy re-implementation of
PDEBench's ``metric_func`` formulas (its branch per dim count) on the whole fields, per frame too, on 1
and 4 ranks (slab, pencil, uneven and empty shards, data x spatial); bad arguments are refused before
any collective."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import attempts_without_collectives, mesh_for
from reference import pdebench_reference
from torch.distributed.tensor import Replicate, Shard

from drift.layout import Layout, chunk_slice, device_mesh
from drift.metrics import NAMES, PER_FRAME, PDEBenchMetrics

FIELDS = ("density", "Vx")
TIMES = 3
TRAJECTORIES = 5


def _fields(shape, seed=0):
    """Prediction and truth ``(trajectories, fields, *shape, t)`` in float64, the truth away from zero."""
    g = torch.Generator().manual_seed(seed)
    size = (TRAJECTORIES, len(FIELDS), *shape, TIMES)
    true = 1.5 + torch.rand(size, generator=g, dtype=torch.float64)
    return true + 0.3 * torch.randn(size, generator=g, dtype=torch.float64), true


def _as_pdebench(t: torch.Tensor):
    """``(b, c, *spatial, t)`` as PDEBench's arrays ``(b, *spatial, t, c)``."""
    return t.movedim(1, -1).numpy()


@functools.cache
def _reference(shape, lengths=None) -> dict:
    return pdebench_reference(*map(_as_pdebench, _fields(shape)), lengths=lengths)


def _sharded_metrics(shape, grid, data_parallel: bool, batch: int, lengths=None) -> dict:
    """One rank: the metrics of its blocks of ``_fields(shape)``, given ``batch`` trajectories at a time.
    ``grid``: ranks per spatial dim (None: one rank); ``data_parallel``: a 2 data x 2 (x-split) mesh
    where each data rank takes its ``torch.chunk`` share of every batch."""
    device = device_for(dist.get_rank() if dist.is_initialized() else 0)
    if data_parallel:
        mesh = device_mesh((2, 2), ("data", "x"), device.type)
        placements = (Replicate(), Shard(0))
    elif grid is None:
        mesh, placements = None, ()
    else:
        mesh, placements = mesh_for(grid)
    layout = Layout(shape, mesh, placements)
    metrics = PDEBenchMetrics(layout, FIELDS, TIMES, TRAJECTORIES, lengths=lengths, device=device)
    pred, true = _fields(shape)
    block = (slice(None), slice(None), *layout.local_slices)
    for start in range(0, TRAJECTORIES, batch):
        mine = list(range(start, min(start + batch, TRAJECTORIES)))
        if data_parallel:
            mine = mine[chunk_slice(len(mine), 2, mesh.get_coordinate()[0])]
        metrics.update(pred[mine][block].to(device), true[mine][block].to(device), mine)
    return metrics.compute()


def _close(got: float, want: float, what) -> None:
    assert abs(got - want) <= 1e-12 * abs(want), (what, got, want)


def _check(got: dict, want: dict) -> None:
    for name in NAMES:
        if want[name] is None:
            assert got[name] is None, name
        else:
            _close(got[name], want[name], name)
    assert set(got["per_frame"]) == set(PER_FRAME)
    for name in PER_FRAME:
        assert len(got["per_frame"][name]) == TIMES, name
        for t, (g, w) in enumerate(zip(got["per_frame"][name], want["per_frame"][name], strict=True)):
            _close(g, w, (name, t))


# (spatial grid, ranks per dim, world size, data x spatial), on 1 to 4 ranks. 1D: 29 points reach the
# high band (rfft's 15 frequencies, one bin each); 3 over 4 ranks leaves rank 3 without points and ranks
# 2-3 without modes. 2D: 26 x 29 reaches the high band (bins up to 12), split on the half-spectrum dim;
# 13 x 7 over a 2 x 2 pencil is uneven on both dims. 3D: 26 x 27 x 28 reaches the high band; 5 over 4
# ranks leaves rank 3 without points; the pencils split two dims unevenly.
CASES = {
    "1d, one rank": ((29,), None, 1, False),
    "1d, slab, uneven": ((11,), (4,), 4, False),
    "1d, slab, empty shard": ((3,), (4,), 4, False),
    "1d, 2 data x 2 spatial": ((11,), None, 4, True),
    "1d, 2 ranks": ((11,), (2,), 2, False),
    "2d, one rank": ((13, 7), None, 1, False),
    "2d, slab, uneven": ((13, 7), (4, 1), 4, False),
    "2d, slab of the last dim": ((26, 29), (1, 4), 4, False),
    "2d, slab, empty shard": ((3, 11), (4, 1), 4, False),
    "2d, pencil, uneven": ((13, 7), (2, 2), 4, False),
    "2d, 2 data x 2 spatial": ((13, 7), None, 4, True),
    "2d, 3 ranks": ((13, 7), (1, 3), 3, False),
    "3d, one rank": ((26, 27, 28), None, 1, False),
    "3d, odd, one rank": ((7, 5, 9), None, 1, False),
    "3d, slab, uneven": ((26, 27, 28), (4, 1, 1), 4, False),
    "3d, slab, empty shard": ((5, 12, 9), (4, 1, 1), 4, False),
    "3d, pencil, uneven": ((13, 10, 9), (2, 1, 2), 4, False),
    "3d, odd pencil": ((7, 5, 9), (1, 2, 2), 4, False),
    "3d, 2 data x 2 spatial": ((11, 8, 9), None, 4, True),
}


@pytest.mark.parametrize("case", CASES)
def test_metrics_equal_pdebench_formulas(ranks, case):
    shape, grid, size, data_parallel = CASES[case]
    want = _reference(shape)
    for got in ranks.run(size, _sharded_metrics, shape, grid, data_parallel, 2):
        _check(got, want)


@pytest.mark.parametrize(
    "shape, grid, lengths", [((11,), (4,), (2.5,)), ((13, 7), (2, 2), (2.0, 0.5)), ((7, 5, 9), (4, 1, 1), (3, 1, 0.25))]
)
def test_lengths_scale_frmse_as_pdebench(ranks, shape, grid, lengths):
    """fRMSE scales by Lx (Ly, Lz) in every branch; the other metrics do not depend on them."""
    want = _reference(shape, lengths)
    for got in ranks.run(4, _sharded_metrics, shape, grid, False, TRAJECTORIES, lengths):
        _check(got, want)


def test_bands_follow_the_grid():
    """Bins stop at min(n // 2) in 2D and 3D, at rfft's n // 2 + 1 frequencies in 1D."""
    # On 16^3 the high band is empty (None) and the mid band holds bins 4..7.
    shape = (16, 16, 16)
    got = _sharded_metrics(shape, None, False, TRAJECTORIES)
    _check(got, _reference(shape))
    assert got["frmse_high"] is None and got["frmse_mid"] is not None
    assert set(got) == {*NAMES, "per_field", "per_frame"} and set(got["per_field"]) == set(FIELDS)
    density = pdebench_reference(*(_as_pdebench(t[:, :1]) for t in _fields(shape)))
    _close(got["per_field"]["density"]["rmse"], density["rmse"], "density rmse")
    # An extent of 1 leaves no bin at all in 2D and 3D: every band is None, the other metrics as PDEBench's.
    for flat in ((1, 8, 6), (9, 1)):
        no_bins = _sharded_metrics(flat, None, False, TRAJECTORIES)
        _check(no_bins, _reference(flat))
        assert no_bins["frmse_low"] is no_bins["frmse_mid"] is no_bins["frmse_high"] is None
    # In 1D one point has its one (DC) bin; 24 points reach bin 12, the high band, where 2D needs 26.
    for n, high in ((1, False), (23, False), (24, True)):
        got = _sharded_metrics((n,), None, False, TRAJECTORIES)
        _check(got, _reference((n,)))
        assert got["frmse_low"] is not None and (got["frmse_high"] is not None) == high, n
    assert _sharded_metrics((25, 25), None, False, TRAJECTORIES)["frmse_high"] is None


def test_per_frame_follows_the_error_of_each_frame():
    """A steady truth and an error that grows with the frame give per-frame RMSE and nRMSE growing in
    proportion, and their means over frames are the overall metrics."""
    shape = (6, 5)
    g = torch.Generator().manual_seed(0)
    true = 1.0 + torch.rand(2, len(FIELDS), *shape, 1, generator=g, dtype=torch.float64).expand(-1, -1, -1, -1, TIMES)
    growth = torch.arange(1, TIMES + 1, dtype=torch.float64)
    metrics = PDEBenchMetrics(Layout(shape), FIELDS, TIMES, 2)
    metrics.update(true + 0.01 * growth * true, true, [0, 1])
    got = metrics.compute()
    for name in PER_FRAME:
        frames = torch.tensor(got["per_frame"][name], dtype=torch.float64)
        assert torch.allclose(frames / frames[0], growth, rtol=1e-12), (name, frames)
        _close(float(frames.mean()), got[name], name)
    assert torch.allclose(torch.tensor(got["per_frame"]["nrmse"], dtype=torch.float64), 0.01 * growth, rtol=1e-12)


def _layout_of(dims: int) -> Layout:
    return Layout((4, 5, 6)[:dims])


def test_arguments_are_refused_naming_what_was_given_and_expected():
    for dims in (1, 2, 3):
        with pytest.raises(ValueError, match=rf"lengths \(1\.0, 1\.0, 1\.0, 1\.0\).*\({dims}\)"):
            PDEBenchMetrics(_layout_of(dims), FIELDS, TIMES, 2, lengths=(1.0,) * 4)
    bad = [
        (dict(layout=Layout((4, 4, 4, 4))), r"1, 2 or 3 spatial dims, the layout has 4"),
        (dict(fields=()), r"fields \(\)"),
        (dict(fields=("u", "u")), r"fields \('u', 'u'\).*distinct"),
        (dict(times=0), r"times must be an int of at least 1, got 0"),
        (dict(trajectories=2.0), r"trajectories must be an int of at least 1, got 2\.0"),
        (dict(lengths=(1.0, -2.0)), r"lengths \(1\.0, -2\.0\).*positive"),
        (dict(bands=(0, 4)), r"bands \(0, 4\)"),
        (dict(bands=(8, 4)), r"bands \(8, 4\)"),
    ]
    for override, message in bad:
        args = dict(layout=_layout_of(2), fields=FIELDS, times=TIMES, trajectories=2) | override
        with pytest.raises(ValueError, match=message):
            PDEBenchMetrics(**args)


def test_blocks_of_another_shape_or_trajectory_are_refused():
    for dims in (1, 2, 3):
        metrics = PDEBenchMetrics(_layout_of(dims), FIELDS, TIMES, 2)
        good = torch.zeros(1, 2, *(4, 5, 6)[:dims], TIMES)
        wrong = torch.zeros(1, 2, *(4, 5, 6)[: dims - 1], 3, TIMES)
        expected = rf"\(1, 2, {', '.join(map(str, (4, 5, 6)[:dims]))}, {TIMES}\)"
        with pytest.raises(ValueError, match=rf"blocks {expected}"):
            metrics.update(wrong, wrong, [0])
        with pytest.raises(ValueError, match="blocks"):
            metrics.update(good[..., 0], good[..., 0], [0])  # no time dim
        with pytest.raises(ValueError, match=r"0\.\.1"):
            metrics.update(good, good, [2])
        with pytest.raises(ValueError, match="real"):
            metrics.update(good.to(torch.complex128), good, [0])
        with pytest.raises(ValueError, match="once"):
            metrics.update(torch.cat([good, good]), torch.cat([good, good]), [1, 1])
        metrics.update(good, good, [0])
        with pytest.raises(ValueError, match=r"\[0\] were already given"):
            metrics.update(good, good, [0])


def _refusals(shape) -> list:
    """One rank of a 4-rank slab: the errors of bad updates, none of which issued a collective."""
    layout = Layout(shape, *mesh_for((4,) + (1,) * (len(shape) - 1)))
    metrics = PDEBenchMetrics(layout, FIELDS, TIMES, 2, device=device_for(dist.get_rank()))
    block = torch.zeros(1, len(FIELDS), *layout.local_shape, TIMES, device=metrics.device)
    too_long = torch.zeros(1, len(FIELDS), layout.local_shape[0] + 1, *layout.local_shape[1:], TIMES)
    return attempts_without_collectives(
        [
            (lambda b: metrics.update(b, b, [0]), too_long.to(metrics.device)),
            (lambda b: metrics.update(b, b, [5]), block),
        ]
    )


@pytest.mark.parametrize("shape", [(7,), (7, 5)])
def test_bad_blocks_are_refused_before_any_collective(ranks, shape):
    for errors in ranks.run(4, _refusals, shape):
        assert [kind for kind, _ in errors] == ["ValueError", "ValueError"], errors
        assert "blocks" in errors[0][1] and "0..1" in errors[1][1], errors
