"""A ``TruncatedFFT``'s passes as autograd nodes, each paired with its adjoint: the maps are linear, so a
backward is the adjoint map applied to the gradient (itself such a node, so double backward works) and
nothing is saved. The reduce-scatter's adjoint is the all-gather, and the other way round."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from drift.truncated._transform import TruncatedFFT


class LinearMap(torch.autograd.Function):
    """A plan's stages as one autograd node: the map is linear, so its backward is the adjoint map applied
    to the gradient (itself such a node, so double backward works) and nothing is saved."""

    @staticmethod
    def forward(ctx, plan: TruncatedFFT, stages, adjoint, name: str, t: torch.Tensor) -> torch.Tensor:
        ctx.plan, ctx.stages, ctx.adjoint, ctx.name = plan, stages, adjoint, name
        return plan._run_chunks(stages, t, name)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        plan = ctx.plan
        return None, None, None, None, plan._run(ctx.adjoint, grad.contiguous(), f"{ctx.name}_adjoint", ctx.stages)


class ScatterMap(torch.autograd.Function):
    """A plan's stages, then the reduce-scatter of the result's shares (``_scatter_pieces``); its adjoint
    is ``GatherMap`` with the adjoint stages, and the other way round."""

    @staticmethod
    def forward(ctx, plan: TruncatedFFT, stages, adjoint, name: str, t: torch.Tensor) -> torch.Tensor:
        ctx.plan, ctx.stages, ctx.adjoint, ctx.name = plan, stages, adjoint, name
        return plan._scatter_pieces(stages, t, name)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gathered = ctx.plan._gather(ctx.adjoint, ctx.stages, f"{ctx.name}_adjoint", grad.contiguous())
        return None, None, None, None, gathered


class GatherMap(torch.autograd.Function):
    """The all-gather of every rank's shares, then a plan's stages (``_gather_pieces``)."""

    @staticmethod
    def forward(ctx, plan: TruncatedFFT, stages, adjoint, name: str, t: torch.Tensor) -> torch.Tensor:
        ctx.plan, ctx.stages, ctx.adjoint, ctx.name = plan, stages, adjoint, name
        return plan._gather_pieces(stages, t, name)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scattered = ctx.plan._scatter(ctx.adjoint, ctx.stages, f"{ctx.name}_adjoint", grad.contiguous())
        return None, None, None, None, scattered
