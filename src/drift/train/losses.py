"""The training losses of ``--loss`` on this rank's blocks: each rank returns its share of the global batch's
loss (the ranks' losses sum to it) whose gradient is its block's part of the global loss's gradient."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from drift import comm


def squared_error(pred: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None, count: int) -> torch.Tensor:
    """``--loss mse`` (``weights`` None) and ``frame-weighted``: this rank's share of the (weighted) mean
    squared error over the ``count`` elements of the global batch's targets."""
    error = F.mse_loss(pred, y, reduction="sum") if weights is None else ((pred - y).square() * weights).sum()
    return error / count


def relative_l2(
    pred: torch.Tensor,
    y: torch.Tensor,
    rows: Sequence[int],
    size: int,
    sharers: int,
    physical: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``--loss relative-l2`` (neuraloperator's ``LpLoss``): the mean over the global batch of ``size``
    trajectories of ``||pred - y|| / ||y||``, each norm over the whole trajectory (every field, point and
    counted frame) of the normalised fields. With ``physical`` (the fields' mean and std, broadcasting
    against ``y``: ``Trajectories.field_tensors``), ``--loss nrmse``
    (PDEBench's nRMSE): the mean over the trajectories and fields of each field's relative L2 error in
    physical units (``value * std + mean``). ``pred`` and ``y``: this rank's blocks ``(share, fields, ...)``
    of the trajectories at positions ``rows`` of the batch; ``sharers``: the ranks that hold blocks of each
    trajectory (the spatial ranks).

    The norms need every rank's block: one all-reduce of each trajectory's sums (no gradient through it).
    With E and Y a norm's global sums of squared error and of squared target, the gradient of sqrt(E / Y)
    is dE / (2 sqrt(E Y)), and this rank's part of dE is the gradient of its own sum of squared error: the
    returned loss has that gradient and the value of this rank's share of the global loss."""
    if physical is None:
        e = (pred - y).square().flatten(1).sum(1, keepdim=True)
        t = y.square().flatten(1).sum(1, keepdim=True)
    else:
        mean, std = physical
        e = ((pred - y) * std).square().flatten(2).sum(2)
        t = (y * std + mean).square().flatten(2).sum(2)
    norms = e.shape[1]  # the norms of each trajectory the loss averages: 1, or one per field
    sums = torch.zeros(size, norms, 2, dtype=torch.float64, device=pred.device)
    sums[list(rows)] = torch.stack([e.detach(), t], 2).double()
    total, target = comm.all_reduce(sums)[list(rows)].unbind(2)
    surrogate = (e / (2 * (total * target).sqrt()).to(e.dtype)).sum() / (size * norms)
    share = ((total / target).sqrt().sum() / (size * norms * sharers)).to(e.dtype)
    return surrogate + (share - surrogate).detach()
