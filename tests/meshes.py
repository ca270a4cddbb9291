"""DeviceMeshes for the rank workers, made once per worker process, and torch's own sharding of tensors.

Making a mesh creates process groups (a collective on every rank), so each worker keeps the meshes it
made: ``mesh_for(grid)`` is ``drift.grid_mesh(grid)`` the first time a grid is asked for, and the same
mesh afterwards. A fresh pool (after a failure) starts with an empty cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from harness import device_for
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import drift

_MESHES: dict[tuple, tuple] = {}


def mesh_for(grid: Sequence[int]) -> tuple:
    """``drift.grid_mesh(grid)`` on this worker's device type, made once per worker process."""
    key = (tuple(grid), device_for(dist.get_rank()).type)
    if key not in _MESHES:
        _MESHES[key] = drift.grid_mesh(*key)
    return _MESHES[key]


def rank_coordinates(mesh) -> list[tuple[int, ...]]:
    """The mesh coordinate of every rank, indexed by rank."""
    layout = mesh.mesh
    coords = [()] * layout.numel()
    for index in torch.cartesian_prod(*[torch.arange(n) for n in layout.shape]).reshape(layout.numel(), -1):
        coords[int(layout[tuple(index.tolist())])] = tuple(index.tolist())
    return coords


def lead_placements(placements: Sequence, lead: int) -> tuple:
    """Placements of a field with ``lead`` leading (batch) dims before the transformed dims."""
    return tuple(Shard(p.dim + lead) if isinstance(p, Shard) else p for p in placements)


def distribute(x: torch.Tensor, mesh, placements: Sequence, lead: int, requires_grad: bool = False) -> DTensor:
    """torch's DTensor of ``x`` (given on every rank) split as ``placements`` say after ``lead`` dims,
    made locally (no collective) and optionally a leaf that records gradients."""
    x = x.detach().to(device_for(dist.get_rank())).requires_grad_(requires_grad)
    return distribute_tensor(x, mesh, lead_placements(placements, lead), src_data_rank=None)


def local_block(x: torch.Tensor, mesh, placements: Sequence, lead: int) -> torch.Tensor:
    """This rank's block of ``x`` under ``placements``, as torch's DTensor sharding cuts it."""
    return distribute(x, mesh, placements, lead).to_local()
