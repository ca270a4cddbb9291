"""Modules whose parameters every rank holds alike, their gradients summed over the mesh."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import Replicate, distribute_tensor

from drift import comm
from drift._plan import ComplexModule


class Replicated(ComplexModule):
    """A module whose parameters are replicated on every rank of its mesh.

    ``distribute_`` (``drift.nn.parallelize`` calls it) sets ``mesh`` (None on one device) and makes each
    parameter a plain tensor equal on every rank. The module passes each parameter through
    ``replicated`` in its forward pass, whose backward all-reduces the gradient over every mesh dim: each
    rank's ``.grad`` is then the gradient of the global loss, as for drift's other replicated parameters.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mesh = None
        self.input_placements: tuple | None = None
        self.data_axes: tuple[int, ...] = ()

    @torch.no_grad()
    def distribute_(self, mesh, placements: Sequence, data_axes: Sequence[int]) -> None:
        """Replicate the module over ``mesh``, in place, for inputs placed as ``placements`` (``data_axes``
        the mesh dims that shard their batch): each of its own parameters becomes the mesh's first rank's
        value on every rank. ValueError, before any change, if it is already distributed."""
        if self.mesh is not None:
            raise ValueError(f"{type(self).__name__} is already parallelized over {self.mesh}")
        self.mesh, self.input_placements, self.data_axes = mesh, tuple(placements), tuple(data_axes)
        for name, param in list(self.named_parameters(recurse=False)):
            setattr(self, name, nn.Parameter(first_rank_value(mesh, param.detach()), requires_grad=param.requires_grad))

    def replicated(self, param: torch.Tensor) -> torch.Tensor:
        """``param`` unchanged; on a mesh, its gradient is summed over all ranks in the backward pass."""
        return replicate_over(self.mesh, param)


def replicate_over(mesh, param: torch.Tensor) -> torch.Tensor:
    """``param``, a tensor every rank of ``mesh`` holds alike (None: one device), unchanged; its backward
    all-reduces the gradient over every mesh dim (``comm.replicate``)."""
    if mesh is not None:
        for axis in range(mesh.ndim):
            if mesh.size(axis) > 1:
                param = comm.replicate(param, group=mesh.get_group(axis))
    return param


def first_rank_value(mesh, t: torch.Tensor) -> torch.Tensor:
    """``t`` as the first rank of ``mesh`` holds it, on every rank: a plain tensor (a collective over the
    mesh, so that every rank starts alike)."""
    return distribute_tensor(t, mesh, (Replicate(),) * mesh.ndim).to_local()
