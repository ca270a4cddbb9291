"""drift.Layout and drift.grid_mesh against torch.chunk and torch's DTensor sharding, on 1..4 ranks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import local_block, mesh_for, rank_coordinates
from reference import case_id, chunk_block, mesh_block, random_tensor, rel_err
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

import drift
from drift.layout import chunk_sizes, chunk_slice, nested_chunk

SIZES = [(n, p) for n in (1, 2, 5, 7, 9, 10, 13, 64) for p in (1, 2, 3, 4, 5)]


@pytest.mark.parametrize(("n", "parts"), SIZES)
def test_blocks_follow_torch_chunk(n, parts):
    """ceil(n / parts) per block in rank order; the blocks torch.chunk does not return are empty."""
    chunks = torch.arange(n).chunk(parts)
    sizes = [len(c) for c in chunks] + [0] * (parts - len(chunks))
    assert chunk_sizes(n, parts) == sizes and sum(sizes) == n
    for i in range(parts):
        expected = chunks[i].tolist() if i < len(chunks) else []
        assert list(range(n)[chunk_slice(n, parts, i)]) == expected


@pytest.mark.parametrize(("n", "parts"), [(13, (2, 3)), (5, (4, 2)), (9, (2, 2, 2)), (3, (4, 4)), (64, (3, 5))])
def test_nested_chunks_follow_torch_chunk(n, parts):
    count = torch.zeros(n, dtype=torch.int64)
    for index in torch.cartesian_prod(*[torch.arange(p) for p in parts]).reshape(-1, len(parts)).tolist():
        s = nested_chunk(n, parts, index)
        assert range(n)[s] == range(n)[chunk_block(n, parts, index)]
        count[s] += 1
    assert bool((count == 1).all())


def test_embedded_default_without_process_group():
    """No mesh: one block holding the whole field; scatter and gather copy it and issue no collective."""
    assert not dist.is_initialized()
    layout = drift.Layout((5, 6))
    x = torch.randn(2, 5, 6)
    assert layout.local_shape == (5, 6) and layout.placements == () and layout.size == 1
    assert layout.blocks() == [(slice(0, 5), slice(0, 6))]
    with drift.comm_log() as log:
        block = layout.scatter(x)
        full = layout.gather(block)
    assert log.calls == []
    # Exact here and below: scatter and gather move values, they compute none.
    assert torch.equal(block, x) and torch.equal(full, x) and full.data_ptr() != block.data_ptr()
    with pytest.raises(drift.PlanError, match=r"ending in \(5, 6\), got \(2, 5, 7\)"):
        layout.scatter(torch.randn(2, 5, 7))
    with pytest.raises(drift.PlanError, match="local block"):
        layout.gather(torch.randn(6))
    assert drift.grid_mesh((1, 1)) == (None, ())


@pytest.mark.parametrize(
    ("shape", "grid", "match"),
    [
        ((), (), "at least one dim"),
        ((8, 0), (1, 1), "every extent positive"),
        ((8.9, 6), (1, 1), "needs integer extents"),
        ((True, 6), (1, 1), "needs integer extents"),
        ((8, 8), (2, 1), "has 2 ranks but the process group has 1"),
        ((8, 8), (0, 4), "needs positive entries"),
    ],
)
def test_bad_shapes_and_grids(shape, grid, match):
    with pytest.raises(ValueError, match=match):
        drift.Layout(shape, *drift.grid_mesh(grid))


# (global shape, grid, placements other than the grid's or None): slab and pencil meshes, even, odd and
# prime extents, uneven and empty blocks, pencils in either mesh order, a mesh dim the field is
# replicated over.
LAYOUTS = [
    ((10,), (2,), None),
    ((7, 9), (3, 1), None),
    ((5, 6), (4, 1), None),
    ((2, 9), (1, 4), None),
    ((11, 13), (2, 2), None),
    ((11, 13), (2, 2), (Shard(1), Shard(0))),
    ((11, 13), (2, 2), (Replicate(), Shard(1))),
    ((1, 6, 7), (2, 2, 1), None),
    ((5, 6, 4, 3), (1, 1, 1, 3), None),
]


def _layout_id(case):
    shape, grid, placements = case
    return case_id(shape, grid, *([] if placements is None else [placements]))


def _blocks_and_collectives(shape, grid, placements, batch):
    rank = dist.get_rank()
    mesh, grid_placements = mesh_for(grid)
    placements = placements or grid_placements
    layout = drift.Layout(shape, mesh, placements)
    assert layout.coordinate == tuple(mesh.get_coordinate())
    x = random_tensor((*batch, *shape), torch.float64, 7).to(device_for(rank))

    # This rank's block is the one torch's DTensor gives it; scatter takes it, gather joins every one.
    block = layout.scatter(x)
    assert block.is_contiguous() and layout.local_shape == tuple(block.shape[len(batch) :])
    assert torch.equal(block, local_block(x, mesh, placements, len(batch)))
    with drift.comm_log() as log:
        full = layout.gather(block)
    assert torch.equal(full, x)
    assert log.kinds() == ["all_gather"] * len(layout.spatial_axes)
    with pytest.raises(drift.PlanError, match="local block"):
        layout.gather(torch.zeros(*batch, *layout.local_shape[:-1], layout.local_shape[-1] + 1))

    # The shares of a flat dim: a nested Shard over the spatial mesh dims, as DTensor cuts it.
    n = 5
    t = random_tensor((2, n, 3), torch.float64, 8 + rank, complex_=True).to(x.device)
    mine = layout.share_slice(n)
    for q, coord in enumerate(rank_coordinates(mesh)):
        others = layout.share_slice(n, coord)
        spatial = [a for a, p in enumerate(placements) if isinstance(p, Shard)]
        want = chunk_block(n, [mesh.size(a) for a in spatial], [coord[a] for a in spatial])
        assert range(n)[others] == range(n)[want], q
    expected = distribute_tensor(t, mesh, layout.share_placements(1), src_data_rank=None).to_local()
    assert torch.equal(t[:, mine], expected)

    # reduce_scatter_shares: this rank's share of the sum over the ranks that share the field;
    # all_gather_shares: every share of that group joined again.
    every = torch.stack(
        [random_tensor((2, n, 3), torch.float64, 8 + q, complex_=True) for q in range(dist.get_world_size())]
    )
    same_field = [
        q
        for q, coord in enumerate(rank_coordinates(mesh))
        if all(coord[a] == layout.coordinate[a] for a in range(mesh.ndim) if a not in layout.spatial_axes)
    ]
    total = every[same_field].sum(0).to(x.device)
    with drift.comm_log() as log:
        share = layout.reduce_scatter_shares(t)
        joined = layout.all_gather_shares(share, n)
    assert log.kinds() == ["reduce_scatter"] * len(layout.spatial_axes) + ["all_gather"] * len(layout.spatial_axes)
    assert rel_err(share, total[:, mine]) <= 1e-12 and rel_err(joined, total) <= 1e-12
    return layout.local_slices, layout.blocks(), mesh.get_coordinate(), tuple(mesh.shape), placements


@pytest.mark.parametrize("case", LAYOUTS, ids=_layout_id)
def test_blocks_match_dtensor_and_tile_the_field(ranks, case):
    shape, grid, placements = case
    results = ranks.run(math.prod(grid), _blocks_and_collectives, shape, grid, placements, (2,))
    *_, mesh_shape, placements = results[0]
    split = [n for n, p in zip(mesh_shape, placements, strict=True) if isinstance(p, Shard)]
    count = torch.zeros(shape, dtype=torch.int64)
    for local, blocks, coordinate, _, _ in results:
        assert local == mesh_block(shape, mesh_shape, placements, coordinate)
        count[local] += 1
        assert sorted(blocks, key=str) == sorted(results[0][1], key=str)  # every rank lists every block
    assert bool((count == math.prod(grid) // math.prod(split)).all())  # each block on every replica
    tiles = torch.zeros(shape, dtype=torch.int64)
    for block in results[0][1]:
        tiles[block] += 1
    assert bool((tiles == 1).all()) and len(results[0][1]) == math.prod(split)


def _grid_meshes():
    out = {}
    for grid in [(4,), (4, 1), (1, 4), (2, 2), (1, 2, 2), (2, 1, 2, 1)]:
        mesh, placements = drift.grid_mesh(grid)
        out[grid] = (tuple(mesh.shape), placements, dist.get_world_size(mesh.get_group(0)))
    errors = []
    for grid in [(2, 4), (0, 4), (4, -1)]:
        with pytest.raises(ValueError) as info:
            drift.grid_mesh(grid)
        errors.append(str(info.value))
    return out, errors


def test_grid_mesh_has_one_mesh_dim_per_split(ranks):
    out, errors = ranks.run(4, _grid_meshes)[0]
    assert out == {
        (4,): ((4,), (Shard(0),), 4),
        (4, 1): ((4,), (Shard(0),), 4),
        (1, 4): ((4,), (Shard(1),), 4),
        (2, 2): ((2, 2), (Shard(0), Shard(1)), 2),
        (1, 2, 2): ((2, 2), (Shard(1), Shard(2)), 2),
        (2, 1, 2, 1): ((2, 2), (Shard(0), Shard(2)), 2),
    }
    assert "has 8 ranks but the process group has 4" in errors[0]
    assert "needs positive entries" in errors[1] and "needs positive entries" in errors[2]


def _bad_placements():
    mesh, _ = mesh_for((2, 2))
    errors = []
    for placements in [
        (Shard(0), Shard(0)),
        (Shard(-1), Shard(1)),
        (Partial(), Shard(0)),
        (Shard(2), Shard(0)),
        (Shard(0),),
        (Shard(0), "rows"),
    ]:
        with drift.comm_log() as log, pytest.raises(ValueError) as info:
            drift.Layout((8, 6), mesh, placements)
        assert log.calls == []
        errors.append(str(info.value))
    return errors


def _meshes_in_and_out_of_rank_order():
    """Blocks on a mesh that lists its ranks transposed, and the refusal of one that lists them out of order
    along a mesh dim (drift's collectives order a group's blocks by rank, as the group does)."""
    kind = device_for(dist.get_rank()).type
    transposed = DeviceMesh(kind, torch.tensor([[0, 2], [1, 3]]))
    layout = drift.Layout((9, 6), transposed, (Shard(0), Shard(1)))
    x = random_tensor((9, 6), torch.float64, 5)
    gathered = layout.gather(layout.scatter(x))
    blocks = local_block(x, transposed, (Shard(0), Shard(1)), 0)
    with drift.comm_log() as log, pytest.raises(ValueError) as info:
        drift.Layout((8, 6), DeviceMesh(kind, torch.tensor([3, 1, 0, 2])), (Shard(0),))
    assert log.calls == []
    return rel_err(gathered, x), rel_err(layout.scatter(x), blocks), str(info.value)


def test_a_mesh_dim_must_list_its_ranks_in_increasing_order(ranks):
    for round_trip, against_dtensor, error in ranks.run(4, _meshes_in_and_out_of_rank_order):
        assert round_trip == against_dtensor == 0
        assert "mesh dim 0 of the mesh of ranks [3, 1, 0, 2] lists them out of increasing order" in error


def test_bad_placements_name_the_dim(ranks):
    for errors in ranks.run(4, _bad_placements):
        assert "transformed dim 0 is split over mesh dims 0 and 1" in errors[0]
        assert "transformed dim 1 is split over mesh dims 0 and 1" in errors[1]
        assert "mesh dim 0: Partial placements are not supported" in errors[2]
        assert "mesh dim 0: Shard(2) is out of range for 2 transformed dims" in errors[3]
        assert "need one entry per dim of the mesh (2, 2)" in errors[4]
        assert "mesh dim 1: unsupported placement 'rows'" in errors[5]
