"""``parallelize``: one call that makes a single-device drift model distributed over a DeviceMesh."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from drift import comm
from drift.layout import reduction_mesh
from drift.nn.auto import Machine, choose_reduction
from drift.nn.factorized import FactorizedWeight
from drift.nn.replicated import Replicated
from drift.nn.spectral import AUTO, SpectralConv, resolve_methods


def _roles(mesh, placements: Sequence, d: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The data-parallel mesh dims (``Shard(0)``) and the spatial ones (``Shard(i)``, i >= 2) of input
    placements for ``(batch, channels, *d spatial dims)``; ValueError for anything else."""
    if len(placements) != mesh.ndim:
        raise ValueError(f"placements {tuple(placements)} need one entry per dim of the {tuple(mesh.shape)} mesh")
    data, spatial, seen = [], [], set()
    for axis, p in enumerate(placements):
        if isinstance(p, Shard) and not -(2 + d) <= p.dim < 2 + d:
            raise ValueError(f"mesh dim {axis}: {p!r} is out of range for inputs of {2 + d} dims")
        if isinstance(p, Shard) and p.dim % (2 + d) == 0:
            data.append(axis)
        elif isinstance(p, Shard) and p.dim % (2 + d) >= 2:
            dim = p.dim % (2 + d)
            if dim in seen:
                raise ValueError(f"mesh dim {axis}: spatial dim {dim} is already split by another mesh dim")
            seen.add(dim)
            spatial.append(axis)
        elif isinstance(p, Replicate) and mesh.size(axis) == 1:
            continue
        else:
            raise ValueError(
                f"mesh dim {axis} ({mesh.size(axis)} ranks) has placement {p!r}: each mesh dim must shard the batch "
                f"(Shard(0), data parallel) or a spatial dim (Shard(2) .. Shard({d + 1})) of the input"
            )
    return tuple(data), tuple(spatial)


def parallelize(
    model: nn.Module,
    mesh,
    placements: Sequence,
    *,
    reduction: Sequence[int] | DeviceMesh | str | None = None,
    overlap: int = 1,
    global_shape: Sequence[int] | None = None,
    machine: Machine | None = None,
) -> nn.Module:
    """Make ``model`` (drift layers built on one device) distributed over ``mesh``, in place; returns it.

    ``placements`` (one per mesh dim) say how the model's inputs ``(batch, channels, *spatial)`` are
    laid out: ``Shard(0)`` on data-parallel mesh dims, ``Shard(i)`` (i >= 2) on the mesh dims that
    split spatial dim i. The model then takes and returns DTensors laid out so.

    Parameters keep their current values, taken from the mesh's first rank (so every rank starts
    alike). Spectral weights become DTensors: sharded over the spatial mesh dims as their method
    stores them (each rank keeps its share) and replicated over the data dims. Every other parameter
    of drift's layers (``Replicated`` modules: pointwise layers, skips, channel MLPs, norms; spectral
    biases; the factors of factorized spectral weights, from which each rank rebuilds the part of the
    weight it uses) stays a plain tensor replicated on every rank. drift reduces the gradients itself
    (no DDP or FSDP wrapper): each rank's ``.grad`` is the gradient of the global loss, the sum over
    ranks of each rank's loss (for DTensor outputs, the DTensor loss). Parameters of other modules would
    be neither synchronised nor reduced, so they are refused (ValueError naming them), and so is a dfno
    layer's ``domain_padding`` on a spatial dim the mesh splits (PlanError); both before any collective.

    ``reduction``: the factorised reduction of the "drift" layers' spectra over the ranks that share
    a sample (a mesh shape such as ``(nodes, ranks_per_node)`` or a ``drift.reduction_mesh``; see
    ``drift.TruncatedFFT``), made once here for every layer. It leaves every rank's share, and so the
    weights, their placements and state dicts, as they are without it. ValueError before any
    collective when it does not factor that rank count or a spectral layer is not "drift". ``"auto"``:
    the shape ``drift.nn.auto.choose_reduction`` models fastest on ``machine`` (on several hosts,
    ``Machine.hosts``: often within hosts, then across), none when a layer's ``method="auto"`` becomes
    another method; it needs ``global_shape``.

    ``overlap``: the "drift" layers' spectrum collectives in this many pieces, each overlapping the next
    piece's transform (``drift.TruncatedFFT``'s ``overlap``; 1: none). ValueError before any collective
    when it is not a positive int or, above 1, a spectral layer is not "drift".

    ``global_shape`` (the inputs' spatial extents) and ``machine`` (``drift.nn.auto.Machine``, default
    ``Machine.default(mesh.device_type)``): for layers built with ``method="auto"``, which become the
    method the cost model predicts fastest there (``layer.choice`` says why; dfno-pruned is no candidate
    with ``reduction``, ``overlap`` or with domain padding on a split dim). Required when there is such a layer.
    """
    d = next((m.ndim for m in model.modules() if isinstance(m, SpectralConv)), None)
    if d is None:
        raise ValueError("parallelize found no drift.nn.SpectralConv in the model")
    data_axes, spatial_axes = _roles(mesh, placements, d)
    placements = tuple(Shard(p.dim % (2 + d)) if isinstance(p, Shard) else p for p in placements)
    split = [any(placements[a].dim == 2 + i and mesh.size(a) > 1 for a in spatial_axes) for i in range(d)]
    layers = [m for m in model.modules() if isinstance(m, SpectralConv)]
    chosen_reduction = isinstance(reduction, str)
    if chosen_reduction:
        reduction = _choose_reduction(layers, mesh, placements, spatial_axes, global_shape, machine, reduction)
    if any(m.method == AUTO for m in layers):
        # Costed with drift's reduction and overlap as given; every rank chooses alike (the model is deterministic).
        parts = _spatial_parts(layers, mesh, placements, spatial_axes, global_shape, "method='auto'")
        drift_only = (reduction is not None and not chosen_reduction) or overlap != 1
        shape = tuple(reduction.shape) if isinstance(reduction, DeviceMesh) else reduction
        machine = machine or Machine.default(mesh.device_type)
        resolve_methods(model, global_shape, parts, machine=machine, reduction=shape, drift_options=drift_only)
        if chosen_reduction and any(not m.spectral_method.takes_reduction for m in layers):
            reduction = None  # the model found a method that takes no reduction mesh faster
    for module in layers:
        module.check_padding_split(split)
    handled = {id(p) for m in model.modules() if isinstance(m, SpectralConv | Replicated) for p in m.parameters()}
    other = [name for name, p in model.named_parameters() if id(p) not in handled]
    if other:
        raise ValueError(
            f"parallelize handles drift's layers only; these parameters would be neither synchronised nor "
            f"reduced: {', '.join(other)}"
        )
    if not isinstance(overlap, int) or overlap < 1:
        raise ValueError(f"overlap must be a positive number of pieces, got {overlap!r}")
    others = sorted({m.method for m in layers if not m.spectral_method.takes_reduction})
    for name, given in (("reduction", reduction is not None), ("overlap", overlap != 1)):
        if given and others:
            raise ValueError(f"{name} applies to method 'drift' only; the model has {', '.join(others)} layers")
    if reduction is not None and not isinstance(reduction, DeviceMesh):
        reduction = reduction_mesh(mesh, spatial_axes, reduction)
    # What can still fail (a dfno-pruned layout) fails here, before the model changes.
    weight_placements = {id(m): _weight_placements(m, mesh, placements) for m in layers}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, FactorizedWeight):  # its SpectralConv came first and was checked
                module.mesh = mesh
                for param in module.parameters():
                    param.copy_(distribute_tensor(param.detach(), mesh, (Replicate(),) * mesh.ndim).to_local())
                continue
            if not isinstance(module, SpectralConv | Replicated):
                continue
            if module.mesh is not None:
                raise ValueError(f"{type(module).__name__} is already parallelized over {module.mesh}")
            module.mesh, module.input_placements, module.data_axes = mesh, tuple(placements), data_axes
            for name, param in list(module.named_parameters(recurse=False)):
                value = param.detach()
                if isinstance(module, SpectralConv) and name == "weight":
                    stored = distribute_tensor(value, mesh, weight_placements[id(module)])
                else:
                    stored = distribute_tensor(value, mesh, (Replicate(),) * mesh.ndim).to_local()
                setattr(module, name, nn.Parameter(stored, requires_grad=param.requires_grad))
            if isinstance(module, SpectralConv):
                module.reduction, module.overlap = reduction, overlap
                module.plans.clear()
    return model


def _spatial_parts(layers, mesh, placements, spatial_axes, global_shape, what: str) -> list[int]:
    """Ranks per spatial dim of the inputs; ValueError without ``global_shape`` (``what`` needs it)."""
    d = layers[0].ndim
    if global_shape is None or len(global_shape) != d:
        raise ValueError(
            f"{what} chooses by the grid: pass parallelize(..., global_shape=) the {d} spatial extents "
            f"of the inputs, got {global_shape!r}"
        )
    return [math.prod(mesh.size(a) for a in spatial_axes if placements[a].dim == 2 + i) for i in range(d)]


def _choose_reduction(layers, mesh, placements, spatial_axes, global_shape, machine, reduction: str):
    """``reduction="auto"``: the reduction mesh shape ``drift.nn.auto.choose_reduction`` models fastest for
    the first spectral layer's spectrum (None: one level per mesh dim)."""
    if reduction != AUTO:
        raise ValueError(f"reduction must be a mesh shape, a reduction mesh, None or 'auto', got {reduction!r}")
    parts = _spatial_parts(layers, mesh, placements, spatial_axes, global_shape, "reduction='auto'")
    layer = layers[0]
    padded = [n + b + a for n, (b, a) in zip(global_shape, layer.padding_at(global_shape), strict=True)]
    spectrum_bytes = math.prod(len(m) for m in layer.modes_at(padded)) * 2 * torch.finfo(layer.precision()).bits // 8
    machine = machine or Machine.default(mesh.device_type)
    channels = dict(in_channels=layer.in_channels, out_channels=layer.out_channels)
    return choose_reduction(parts, spectrum_bytes, **channels, machine=machine)


def _weight_placements(layer: SpectralConv, mesh, placements: Sequence) -> tuple:
    """How ``layer`` stores its weight over ``mesh`` for inputs placed as ``placements``."""
    _, spatial_axes = _roles(mesh, placements, layer.ndim)
    return layer.spectral_method.weight_placements(layer, mesh, placements, spatial_axes)


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a parallelized model, whose gradients mix DTensors (spectral
    weights, sharded over the spatial mesh dims) and plain tensors replicated on every rank, which torch's
    refuses. The norm (``norm_type`` 2 or inf) is the global gradient's: each DTensor block counts once,
    each replicated tensor once. Every rank scales its gradients by ``max_norm / (norm + 1e-6)`` where that
    is below 1 and returns the norm (float64, on the gradients' device). Without DTensors, torch's."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    meshes = {g.device_mesh for g in grads if isinstance(g, DTensor)}
    if not meshes:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
    if norm_type not in (2, math.inf):
        raise ValueError(f"clip_grad_norm_ of a parallelized model takes norm_type 2 or inf, got {norm_type!r}")
    if len(meshes) > 1:
        raise ValueError("clip_grad_norm_: the gradients' DTensors lie on several meshes")
    (mesh,) = meshes
    blocks = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    total = torch.zeros((), dtype=torch.float64, device=blocks[0].device)
    for g, block in zip(grads, blocks, strict=True):
        if block.numel() == 0:
            continue
        if norm_type == math.inf:
            total = torch.maximum(total, torch.linalg.vector_norm(block, math.inf).double())
            continue
        # The ranks that hold this block: every rank for a plain tensor, the unsharded mesh dims' for a DTensor.
        holders = mesh.size()
        if isinstance(g, DTensor):
            holders = math.prod(mesh.size(a) for a, p in enumerate(g.placements) if not isinstance(p, Shard))
        total += torch.linalg.vector_norm(block).double().square() / holders
    for axis in range(mesh.ndim):
        reduce = comm.all_reduce_max if norm_type == math.inf else comm.all_reduce
        total = reduce(total, group=mesh.get_group(axis))
    norm = total if norm_type == math.inf else total.sqrt()
    if error_if_nonfinite and not bool(torch.isfinite(norm)):
        raise RuntimeError(
            f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot be clipped"
        )
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for block in blocks:
        block.mul_(scale)
    return norm
