import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for

import drift
from drift.decomposition import block_sizes, block_slice, check_grid, grid_coords


@pytest.mark.parametrize(("n", "parts"), [(n, p) for n in (1, 2, 7, 10, 13, 64) for p in (1, 2, 3, 4, 5) if p <= n])
def test_blocks_follow_tensor_split(n, parts):
    chunks = torch.arange(n).tensor_split(parts)
    assert block_sizes(n, parts) == [len(c) for c in chunks]
    for i, chunk in enumerate(chunks):
        assert list(range(n)[block_slice(n, parts, i)]) == chunk.tolist()


def test_grid_coords_are_row_major():
    grid = (2, 3, 4)
    coords = [grid_coords(r, grid) for r in range(24)]
    assert coords == sorted(coords)
    assert coords[1] == (0, 0, 1) and coords[4] == (0, 1, 0) and coords[12] == (1, 0, 0)


@pytest.mark.parametrize(
    ("shape", "grid"),
    [((13,), (4,)), ((7, 5), (3, 1)), ((9, 10, 11), (2, 1, 3)), ((5, 6, 7, 8), (1, 2, 2, 2))],
)
def test_local_slices_tile_the_global_shape(shape, grid):
    count = torch.zeros(shape, dtype=torch.int64)
    for rank in range(math.prod(grid)):
        count[drift.local_slices(shape, grid, rank)] += 1
    assert bool((count == 1).all())


@pytest.mark.parametrize(
    ("shape", "grid", "size", "match"),
    [
        ((8, 8), (2, 2), 3, "has 4 ranks but the process group has 3"),
        ((8, 3), (1, 4), 4, "exceeds its extent 3"),
        ((8, 8), (4,), 4, "one entry per transformed dim"),
        ((8, 8), (0, 4), 0, "must be positive"),
        ((8, 0), (1, 1), 1, "non-positive extent"),
    ],
)
def test_bad_grids(shape, grid, size, match):
    with pytest.raises(ValueError, match=match):
        check_grid(shape, grid, size)


def test_embedded_default_without_process_group():
    assert not dist.is_initialized()
    x = torch.randn(2, 5, 6)
    assert torch.equal(drift.scatter(x, (1, 1)), x)
    assert torch.equal(drift.gather(x, (5, 6), (1, 1)), x)
    with pytest.raises(ValueError, match="has 2 ranks"):
        drift.scatter(x, (2, 1))


def _scatter_gather(shape, grid, batch):
    rank = dist.get_rank()
    device = device_for(rank)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*batch, *shape, generator=g, dtype=torch.float64).to(device)
    block = drift.scatter(x, grid)
    assert block.is_contiguous()
    assert torch.equal(block, x[(..., *drift.local_slices(shape, grid, rank))])
    with drift.comm_log() as log:
        full = drift.gather(block, shape, grid)
    assert torch.equal(full, x)
    assert log.kinds() == ["all_gather"]
    with pytest.raises(drift.PlanError, match="local block"):
        drift.gather(x, shape, grid)
    return tuple(block.shape)


@pytest.mark.parametrize(
    ("shape", "grid", "batch"),
    [
        ((10,), (2,), ()),
        ((7, 9), (3, 1), (2,)),
        ((11, 13), (2, 2), (3, 1)),
        ((5, 6, 7), (1, 2, 2), (2,)),
        ((6, 5, 4, 3), (1, 1, 1, 3), ()),
    ],
)
def test_scatter_gather_roundtrip(ranks, shape, grid, batch):
    size = math.prod(grid)
    blocks = ranks.run(size, _scatter_gather, shape, grid, batch)
    assert blocks == [(*batch, *(s.stop - s.start for s in drift.local_slices(shape, grid, r))) for r in range(size)]
