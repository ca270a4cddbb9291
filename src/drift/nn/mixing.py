"""Channel mixing: the spectral convolution's per-mode channel matrices applied to a spectrum
(``einsum("bi...,io...->bo...")``), as one autograd node with its own backward."""

from __future__ import annotations

import torch

from drift import memory
from drift.recording import recorded


def _mix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One multiply-add per input channel into one output, vectorised over the modes (several times
    faster on CPU than einsum's tiny batched gemms); not recorded by autograd. The output comes from
    ``drift.memory``'s pool: a fresh one page-faults on every call."""
    first, w0 = x[:, 0].unsqueeze(1), w[0]
    shape = torch.broadcast_shapes(first.shape, w0.shape)
    y = torch.mul(first, w0, out=memory.empty(shape, torch.promote_types(x.dtype, w.dtype), x.device))
    for i in range(1, x.shape[1]):
        y.addcmul_(x[:, i].unsqueeze(1), w[i])
    return y


def _conj(t: torch.Tensor) -> torch.Tensor:
    """``conj(t)`` materialised: recorded under grad mode (a double backward), else into a pooled tensor."""
    if torch.is_grad_enabled():
        return torch.conj_physical(t)
    return torch.conj_physical(t, out=memory.empty_like(t))


class _MixChannels(torch.autograd.Function):
    """``mix_channels`` as one autograd node: its backward is the same product with each mode's adjoint
    channel matrix for ``x``, and ``sum_b conj(x) g`` written once for ``w``, instead of autograd's two
    temporaries per channel and their stacking. Differentiable again (``mix_channels``, mul, addcmul)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _mix(x, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            # sum_o g conj(w[:, o]) = conj(sum_o conj(g) w[:, o]): conjugates of the small tensors only.
            grad_x = _conj(mix_channels(_conj(grad), w.transpose(0, 1)))
        if ctx.needs_input_grad[1]:
            x_conj = _conj(x)
            if x.shape[0] == 0:
                grad_w = torch.zeros_like(w)
            elif torch.is_grad_enabled():  # a double backward records the product
                grad_w = x_conj[0].unsqueeze(1) * grad[0]
            else:
                grad_w = torch.mul(x_conj[0].unsqueeze(1), grad[0], out=memory.empty_like(w))
            for b in range(1, x.shape[0]):  # a data-parallel rank may hold no trajectory of a batch
                grad_w.addcmul_(x_conj[b].unsqueeze(1), grad[b])
        return grad_x, grad_w


def mix_channels(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``einsum("bi...,io...->bo...", x, w)`` over per-mode channel matrices, ``x`` ``(b, in, *modes)``,
    ``w`` ``(in, out, *modes)``: one multiply-add per input channel, vectorised over the modes."""
    if recorded(x, w):
        return _MixChannels.apply(x, w)
    return _mix(x, w)
