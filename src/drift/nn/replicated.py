"""Modules whose parameters every rank holds alike, their gradients summed over the mesh."""

from __future__ import annotations

import torch

from drift import comm
from drift._plan import ComplexModule


class Replicated(ComplexModule):
    """A module whose parameters are replicated on every rank of its mesh.

    ``drift.nn.parallelize`` sets ``mesh`` (None on one device) and makes each parameter a plain tensor
    equal on every rank. The module passes each parameter through ``replicated`` in its forward pass,
    whose backward all-reduces the gradient over every mesh dim: each rank's ``.grad`` is then the
    gradient of the global loss, as for drift's other replicated parameters.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mesh = None
        self.input_placements: tuple | None = None
        self.data_axes: tuple[int, ...] = ()

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
