"""PDEBench's metrics on sharded fields equal a numpy re-implementation of PDEBench's ``metric_func``
formulas on the whole fields, on 1 and 4 ranks (slab, pencil, uneven and empty shards, data x spatial)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import mesh_for
from reference import pdebench_reference
from torch.distributed.tensor import Replicate, Shard

from drift.layout import Layout, chunk_slice, device_mesh
from drift.metrics import NAMES, PDEBenchMetrics

FIELDS = ("density", "Vx")
TIMES = 3
TRAJECTORIES = 5


def _fields(shape, seed=0):
    """Prediction and truth ``(trajectories, fields, x, y, z, t)`` in float64, the truth away from zero."""
    g = torch.Generator().manual_seed(seed)
    size = (TRAJECTORIES, len(FIELDS), *shape, TIMES)
    true = 1.5 + torch.rand(size, generator=g, dtype=torch.float64)
    return true + 0.3 * torch.randn(size, generator=g, dtype=torch.float64), true


@functools.cache
def _reference(shape) -> dict:
    pred, true = _fields(shape)
    return pdebench_reference(*(t.permute(0, 2, 3, 4, 5, 1).numpy() for t in (pred, true)))


def _sharded_metrics(shape, grid, data_parallel: bool, batch: int) -> dict:
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
    metrics = PDEBenchMetrics(layout, FIELDS, TIMES, TRAJECTORIES, device=device)
    pred, true = _fields(shape)
    block = (slice(None), slice(None), *layout.local_slices)
    for start in range(0, TRAJECTORIES, batch):
        mine = list(range(start, min(start + batch, TRAJECTORIES)))
        if data_parallel:
            mine = mine[chunk_slice(len(mine), 2, mesh.get_coordinate()[0])]
        metrics.update(pred[mine][block].to(device), true[mine][block].to(device), mine)
    return metrics.compute()


def _check(got: dict, want: dict) -> None:
    for name in NAMES:
        if want[name] is None:
            assert got[name] is None, name
        else:
            assert abs(got[name] - want[name]) <= 1e-12 * abs(want[name]), (name, got[name], want[name])


# (spatial grid, ranks per dim): 26 x 27 x 28 reaches the high band (bins up to 12); 5 over 4 ranks
# leaves rank 3 without points; the pencil splits x and z unevenly.
CASES = {
    "one rank": ((26, 27, 28), None, 1, False),
    "slab, uneven": ((26, 27, 28), (4, 1, 1), 4, False),
    "slab, empty shard": ((5, 12, 9), (4, 1, 1), 4, False),
    "pencil, uneven": ((13, 10, 9), (2, 1, 2), 4, False),
    "2 data x 2 spatial": ((11, 8, 9), None, 4, True),
}


@pytest.mark.parametrize("case", CASES)
def test_metrics_equal_pdebench_formulas(ranks, case):
    shape, grid, size, data_parallel = CASES[case]
    want = _reference(shape)
    for got in ranks.run(size, _sharded_metrics, shape, grid, data_parallel, 2):
        _check(got, want)


def test_bands_follow_the_grid():
    """Bins stop at min(n // 2): on 16^3 the high band is empty (None) and the mid band holds bins 4..7."""
    shape = (16, 16, 16)
    got = _sharded_metrics(shape, None, False, TRAJECTORIES)
    want = _reference(shape)
    _check(got, want)
    assert got["frmse_high"] is None and got["frmse_mid"] is not None
    assert set(got["per_field"]) == set(FIELDS)
    # An extent of 1 leaves no bin at all: every band is None, the other metrics as PDEBench's.
    flat = (1, 8, 6)
    no_bins = _sharded_metrics(flat, None, False, TRAJECTORIES)
    _check(no_bins, _reference(flat))
    assert no_bins["frmse_low"] is no_bins["frmse_mid"] is no_bins["frmse_high"] is None
    density = pdebench_reference(*(t[:, :1].permute(0, 2, 3, 4, 5, 1).numpy() for t in _fields(shape)))
    assert abs(got["per_field"]["density"]["rmse"] - density["rmse"]) <= 1e-12 * density["rmse"]


def test_blocks_of_another_shape_or_trajectory_are_refused():
    metrics = PDEBenchMetrics(Layout((4, 4, 4)), FIELDS, TIMES, 2)
    with pytest.raises(ValueError, match="blocks"):
        metrics.update(torch.zeros(1, 2, 4, 4, 3, TIMES), torch.zeros(1, 2, 4, 4, 3, TIMES), [0])
    with pytest.raises(ValueError, match=r"0\.\.1"):
        metrics.update(torch.zeros(1, 2, 4, 4, 4, TIMES), torch.zeros(1, 2, 4, 4, 4, TIMES), [2])
