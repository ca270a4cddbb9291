"""``parallelize``: one call that makes a single-device drift model distributed over a DeviceMesh."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from drift import comm
from drift.cost import Machine, choose_reduction
from drift.layout import input_roles, reduction_mesh
from drift.nn.replicated import Replicated
from drift.nn.spectral import AUTO, SpectralConv, resolve_methods


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
    the shape ``drift.cost.choose_reduction`` models fastest on ``machine`` (on several hosts,
    ``Machine.hosts``: often within hosts, then across), none when a layer's ``method="auto"`` becomes
    another method; it needs ``global_shape``.

    ``overlap``: the "drift" layers' spectrum collectives in this many pieces, each overlapping the next
    piece's transform (``drift.TruncatedFFT``'s ``overlap``; 1: none). ValueError before any collective
    when it is not a positive int or, above 1, a spectral layer is not "drift".

    ``global_shape`` (the inputs' spatial extents) and ``machine`` (``drift.cost.Machine``, default
    ``Machine.default(mesh.device_type)``): for layers built with ``method="auto"``, which become the
    method the cost model predicts fastest there (``layer.choice`` says why; dfno-pruned is no candidate
    with ``reduction``, ``overlap`` or with domain padding on a split dim). Required when there is such a layer.

    Example on a mesh of one rank (``torchrun`` starts the process group of several; the same lines run
    on each):

    >>> import torch, torch.distributed as dist
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> from torch.distributed.tensor import Shard, distribute_tensor
    >>> from drift.nn import FNO, parallelize
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> mesh = init_device_mesh("cpu", (1,))
    >>> model = parallelize(FNO(3, 1, width=8, modes=(4, 4), n_layers=2), mesh, [Shard(2)])
    >>> y = model(distribute_tensor(torch.randn(2, 3, 16, 16), mesh, [Shard(2)]))
    >>> type(y).__name__, y.shape, y.placements
    ('DTensor', torch.Size([2, 1, 16, 16]), (Shard(dim=2),))
    >>> dist.destroy_process_group()
    """
    d = next((m.ndim for m in model.modules() if isinstance(m, SpectralConv)), None)
    if d is None:
        raise ValueError("parallelize found no drift.nn.SpectralConv in the model")
    roles = input_roles(mesh, placements, d)
    placements = roles.placements
    layers = [m for m in model.modules() if isinstance(m, SpectralConv)]
    chosen_reduction = isinstance(reduction, str)
    if chosen_reduction:
        reduction = _choose_reduction(layers, mesh, roles.parts, global_shape, machine, reduction)
    if any(m.method == AUTO for m in layers):
        # Costed with drift's reduction and overlap as given; every rank chooses alike (the model is deterministic).
        _check_grid(layers, global_shape, "method='auto'")
        drift_only = (reduction is not None and not chosen_reduction) or overlap != 1
        shape = tuple(reduction.shape) if isinstance(reduction, DeviceMesh) else reduction
        machine = machine or Machine.default(mesh.device_type)
        resolve_methods(model, global_shape, roles.parts, machine=machine, reduction=shape, drift_options=drift_only)
        if chosen_reduction and any(not m.spectral_method.takes_reduction for m in layers):
            reduction = None  # the model found a method that takes no reduction mesh faster
    for module in layers:
        module.check_padding_split([p > 1 for p in roles.parts])
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
        reduction = reduction_mesh(mesh, roles.spatial_axes, reduction)
    # What can still fail (a dfno-pruned layout) fails here, before the model changes.
    for layer in layers:
        layer.weight_placements(mesh, placements)
    for module in model.modules():
        if isinstance(module, SpectralConv):
            module.distribute_(mesh, placements, reduction=reduction, overlap=overlap)
        elif isinstance(module, Replicated):
            module.distribute_(mesh, placements, roles.data_axes)
    return model


def _check_grid(layers, global_shape, what: str) -> None:
    """ValueError unless ``global_shape`` holds the inputs' spatial extents, which ``what`` chooses by."""
    d = layers[0].ndim
    if global_shape is None or len(global_shape) != d:
        raise ValueError(
            f"{what} chooses by the grid: pass parallelize(..., global_shape=) the {d} spatial extents "
            f"of the inputs, got {global_shape!r}"
        )


def _choose_reduction(layers, mesh, parts: Sequence[int], global_shape, machine, reduction: str):
    """``reduction="auto"``: the reduction mesh shape ``drift.cost.choose_reduction`` models fastest for
    the first spectral layer's spectrum (None: one level per mesh dim)."""
    if reduction != AUTO:
        raise ValueError(f"reduction must be a mesh shape, a reduction mesh, None or 'auto', got {reduction!r}")
    _check_grid(layers, global_shape, "reduction='auto'")
    layer = layers[0]
    padded = [n + b + a for n, (b, a) in zip(global_shape, layer.padding_at(global_shape), strict=True)]
    spectrum_bytes = math.prod(len(m) for m in layer.modes_at(padded)) * 2 * torch.finfo(layer.precision()).bits // 8
    machine = machine or Machine.default(mesh.device_type)
    channels = dict(in_channels=layer.in_channels, out_channels=layer.out_channels)
    return choose_reduction(parts, spectrum_bytes, **channels, machine=machine)


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
