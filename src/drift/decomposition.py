"""Block decompositions of a global grid over a Cartesian process grid.

A global extent ``N`` split over ``P`` ranks follows ``torch.tensor_split``: the first ``N % P`` blocks
hold ``N // P + 1`` elements, the others ``N // P``. A rank's coordinates in the process grid are
row-major: the last grid dim varies fastest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from drift import comm
from drift.errors import PlanError


def block_sizes(n: int, parts: int) -> list[int]:
    """Extents of the ``parts`` blocks of ``n`` elements (``torch.tensor_split`` convention)."""
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def block_slice(n: int, parts: int, index: int) -> slice:
    """The slice of ``range(n)`` held by block ``index`` of ``parts``."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def grid_coords(rank: int, grid: Sequence[int]) -> tuple[int, ...]:
    """Row-major coordinates of ``rank`` in the process grid ``grid``."""
    coords = []
    for parts in reversed(grid):
        rank, c = divmod(rank, parts)
        coords.append(c)
    return tuple(reversed(coords))


def grid_rank(coords: Sequence[int], grid: Sequence[int]) -> int:
    """The rank at row-major coordinates ``coords`` of the process grid ``grid``."""
    rank = 0
    for c, parts in zip(coords, grid, strict=True):
        rank = rank * parts + c
    return rank


def check_grid(global_shape: Sequence[int], grid: Sequence[int], world_size: int) -> tuple[int, ...]:
    """Validate ``grid`` against ``global_shape`` and the group size; returns it as a tuple.

    Raises ValueError when the grid has the wrong length, a non-positive entry, an entry larger than
    its extent (an empty block), or a product other than ``world_size``.
    """
    global_shape = tuple(int(n) for n in global_shape)
    grid = tuple(int(p) for p in grid)
    if any(n < 1 for n in global_shape):
        raise ValueError(f"global_shape {global_shape} has a non-positive extent")
    if len(grid) != len(global_shape):
        raise ValueError(f"grid {grid} needs one entry per transformed dim of global_shape {global_shape}")
    for dim, (n, p) in enumerate(zip(global_shape, grid, strict=True)):
        if p < 1:
            raise ValueError(f"grid entry {p} on dim {dim} must be positive")
        if p > n:
            raise ValueError(f"grid entry {p} on dim {dim} exceeds its extent {n}: a block would be empty")
    if math.prod(grid) != world_size:
        raise ValueError(f"grid {grid} has {math.prod(grid)} ranks but the process group has {world_size}")
    return grid


def local_slices(global_shape: Sequence[int], grid: Sequence[int], rank: int) -> tuple[slice, ...]:
    """Global index slices of the block that ``rank`` holds, one per dim of ``global_shape``."""
    grid = check_grid(global_shape, grid, math.prod(grid))
    coords = grid_coords(rank, grid)
    return tuple(block_slice(n, p, c) for n, p, c in zip(global_shape, grid, coords, strict=True))


def local_shape(global_shape: Sequence[int], grid: Sequence[int], rank: int) -> tuple[int, ...]:
    """Extents of the block that ``rank`` holds."""
    return tuple(s.stop - s.start for s in local_slices(global_shape, grid, rank))


def scatter(x_global: torch.Tensor, grid: Sequence[int], *, group=None) -> torch.Tensor:
    """This rank's block of the last ``len(grid)`` dims of ``x_global`` (given on every rank).

    No communication: every rank slices its own block out of its copy. Returns a contiguous tensor.
    """
    d = len(grid)
    if x_global.dim() < d:
        raise ValueError(f"x_global has {x_global.dim()} dims, fewer than the grid's {d}")
    global_shape = tuple(x_global.shape[x_global.dim() - d :])
    check_grid(global_shape, grid, comm.world_size(group))
    slices = local_slices(global_shape, grid, comm.rank(group))
    return x_global[(..., *slices)].contiguous()


def gather(x_local: torch.Tensor, global_shape: Sequence[int], grid: Sequence[int], *, group=None) -> torch.Tensor:
    """The full tensor on every rank from every rank's block (for tests and I/O, not the hot path).

    ``x_local`` is ``(*batch, n1_loc, ..., nd_loc)``; returns ``(*batch, N1, ..., Nd)``. One
    all-gather of blocks padded to the largest block.
    """
    global_shape = tuple(int(n) for n in global_shape)
    d = len(global_shape)
    size = comm.world_size(group)
    grid = check_grid(global_shape, grid, size)
    expected = local_shape(global_shape, grid, comm.rank(group))
    if x_local.dim() < d or tuple(x_local.shape[x_local.dim() - d :]) != expected:
        raise PlanError(f"gather expected a local block ending in {expected}, got shape {tuple(x_local.shape)}")
    batch = tuple(x_local.shape[: x_local.dim() - d])
    if size == 1:
        return x_local.clone()
    padded = tuple(-(-n // p) for n, p in zip(global_shape, grid, strict=True))
    send = x_local.new_zeros(*batch, *padded)
    send[(..., *(slice(0, n) for n in expected))] = x_local
    blocks = comm.all_gather(send.reshape(-1), group=group).view(size, *batch, *padded)
    out = x_local.new_empty(*batch, *global_shape)
    for r in range(size):
        slices = local_slices(global_shape, grid, r)
        out[(..., *slices)] = blocks[r][(..., *(slice(0, s.stop - s.start) for s in slices))]
    return out
