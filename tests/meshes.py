"""DeviceMeshes for the rank workers, made once per worker process, and torch's own sharding of tensors.

Making a mesh creates process groups (a collective on every rank), so each worker keeps the meshes it
made: ``mesh_for(grid)`` is ``drift.grid_mesh(grid)`` the first time a grid is asked for, and the same
mesh afterwards (``reduction_for``: the same for reduction meshes). A fresh pool (after a failure) starts
with an empty cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from harness import attempt, device_for
from reference import random_tensor, rel_err
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import drift

_MESHES: dict[tuple, tuple] = {}
_REDUCTIONS: dict[tuple, object] = {}


def mesh_for(grid: Sequence[int]) -> tuple:
    """``drift.grid_mesh(grid)`` on this worker's device type, made once per worker process."""
    key = (tuple(grid), device_for(dist.get_rank()).type)
    if key not in _MESHES:
        _MESHES[key] = drift.grid_mesh(*key)
    return _MESHES[key]


def model_mesh_for(grid: Sequence[int]) -> tuple:
    """``mesh_for(grid)`` with placements for a model's input ``(batch, channels, *space)``: each spatial
    ``Shard(i)`` moved past the batch and channel dims."""
    mesh, placements = mesh_for(grid)
    return mesh, tuple(Shard(p.dim + 2) if isinstance(p, Shard) else p for p in placements)


def reduction_for(grid: Sequence[int], shape: Sequence[int]):
    """``drift.reduction_mesh`` of ``shape`` over the field of ``mesh_for(grid)``, made once per worker."""
    key = (tuple(grid), tuple(shape))
    if key not in _REDUCTIONS:
        mesh, placements = mesh_for(grid)
        spatial = [a for a, p in enumerate(placements) if isinstance(p, Shard)]
        _REDUCTIONS[key] = drift.reduction_mesh(mesh, spatial, shape, timeout_s=60.0)
    return _REDUCTIONS[key]


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


def linear_functional(t, w):
    """The real linear functional <w, t> (of ``view_as_real(t)`` for complex t), of DTensors or plain tensors."""
    return ((torch.view_as_real(t) if t.is_complex() else t) * w).sum()


def check_dtensor_runs(runs, mesh, device) -> None:
    """For each ``(name, run, single, inp, in_placements, out_placements)``: ``run`` on the DTensor of
    ``inp`` gives a DTensor placed as ``out_placements`` whose full value is ``single(inp)``'s, and the
    gradient of a linear loss, taken on the DTensor or on its full tensor, is single-process autograd's."""
    for seed, (name, run, single, inp, in_placements, out_placements) in enumerate(runs):
        ref_in = inp.clone().requires_grad_(True)
        ref_out = single(ref_in)
        w = random_tensor((torch.view_as_real(ref_out) if ref_out.is_complex() else ref_out).shape, torch.float64, seed)
        linear_functional(ref_out, w).backward()
        for loss in ("dtensor", "full_tensor"):
            xd = distribute(inp, mesh, in_placements, 0, requires_grad=True)
            out = run(xd)
            assert isinstance(out, DTensor) and out.device_mesh == mesh, name
            assert tuple(out.placements) == out_placements, (name, out.placements)
            full = out.full_tensor()
            assert rel_err(full, ref_out) <= 1e-12, (name, rel_err(full, ref_out))
            if loss == "dtensor":
                real_out = torch.view_as_real(out) if out.is_complex() else out
                linear_functional(out, distribute(w, mesh, real_out.placements, 0)).backward()
            else:
                linear_functional(full, w.to(device)).backward()
            assert isinstance(xd.grad, DTensor) and tuple(xd.grad.placements) == in_placements, (name, loss)
            err = rel_err(xd.grad.full_tensor(), ref_in.grad)
            assert err <= 1e-12, (name, loss, err)


def attempts_without_collectives(cases) -> list[tuple[str | None, str]]:
    """For each ``(fn, arg)``: the name and message of what ``fn(arg)`` raised (None, "" if nothing),
    asserting that it issued no drift collective first."""
    errors = []
    for fn, arg in cases:
        with drift.comm_log() as log:
            errors.append(attempt(fn, arg)[:2])
        assert log.calls == []
    return errors
