"""Pointwise maps over points in cache-sized chunks, forward and backward, with no full-size intermediate.

A pointwise map ``y[:, :, j] = f(x[:, :, j])`` (a 1x1-convolution MLP: the FNO's projection) run on a
whole block makes each intermediate, e.g. the projection's 128-channel hidden layer, a tensor of the
block's size: hundreds of MB that glibc maps afresh (and page-faults) on every call, and that autograd
keeps until the backward pass. ``chunked_pointwise`` runs ``f`` on a chunk of points at a time into one
output, keeps only its input for the backward pass, and there recomputes each chunk's intermediates
(activation checkpointing, a chunk at a time) to accumulate the parameters' gradients and write the
input's gradient into one preallocated tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.nn import functional as F

from drift._plan import Workspace
from drift.nn.pointwise import activate

# Intermediates per chunk. On the CPU below glibc's largest mmap threshold (32 MiB), so that chunks reuse
# the heap instead of page-faulting fresh maps (benchmarks/projection.py: 16 MiB was the fastest of 2-16
# MiB, 4x the whole-tensor forward); elsewhere large, each chunk costing kernel launches.
CHUNK_BYTES = {"cpu": 16 * 2**20}
OTHER_DEVICES_CHUNK_BYTES = 256 * 2**20
# Intermediates per chunk in passes through resident buffers (nothing allocated per chunk): on the CPU
# about one core's L2, so that each chunk is written and read back while it is in cache.
RESIDENT_CHUNK_BYTES = {"cpu": 2 * 2**20}

PointwiseFn = Callable[..., torch.Tensor]


def _points_per_chunk(device: torch.device, bytes_per_point: int, chunk_bytes: int | None = None) -> int:
    """Points per chunk: ``chunk_bytes`` (default ``CHUNK_BYTES`` for the device) of intermediates."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES.get(device.type, OTHER_DEVICES_CHUNK_BYTES)
    return max(1, chunk_bytes // max(1, bytes_per_point))


def _resident_points(device: torch.device, bytes_per_point: int) -> int:
    return _points_per_chunk(device, bytes_per_point, RESIDENT_CHUNK_BYTES.get(device.type, OTHER_DEVICES_CHUNK_BYTES))


def activate_(non_linearity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``x`` overwritten by ``activate(non_linearity, x)``; in place without a temporary for real ``x``
    and ``F.gelu`` (exact form), ``F.relu`` or ``torch.relu``."""
    if not x.is_complex():
        if non_linearity is F.gelu:
            return torch.ops.aten.gelu_(x)
        if non_linearity in (F.relu, torch.relu):
            return x.relu_()
    return x.copy_(activate(non_linearity, x))


def mlp_unrecorded(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    non_linearity: Callable[[torch.Tensor], torch.Tensor],
    work: Workspace,
) -> torch.Tensor:
    """``W2 act(W1 x + b1) + b2`` on ``x`` ``(b, c_in, *spatial)`` outside autograd, a cache-sized chunk
    of points at a time through one resident hidden buffer of ``work``: the hidden layer never exists for
    the whole block and nothing is allocated per chunk. Returns a fresh ``(b, c_out, *spatial)``."""
    flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    out = x.new_empty(x.shape[0], w2.shape[0], flat.shape[2])
    hidden = w1.shape[0]
    step = _resident_points(x.device, hidden * x.element_size())
    buffer = work.get(("mlp_hidden",), (hidden * step,), x.dtype, x.device)
    for i in range(flat.shape[0]):
        for s in range(0, flat.shape[2], step):
            part = flat[i, :, s : s + step]
            h = buffer[: hidden * part.shape[1]].view(hidden, part.shape[1])
            if b1 is None:
                torch.mm(w1, part, out=h)
            else:
                torch.addmm(b1[:, None], w1, part, out=h)
            activate_(non_linearity, h)
            if b2 is None:
                torch.mm(w2, h, out=out[i, :, s : s + step])
            else:
                torch.addmm(b2[:, None], w2, h, out=out[i, :, s : s + step])
    return out.view(x.shape[0], w2.shape[0], *x.shape[2:])


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: PointwiseFn, step: int, out_channels: int, x: torch.Tensor, *params: torch.Tensor):
        ctx.fn, ctx.step = fn, step
        ctx.save_for_backward(x, *params)
        out = x.new_empty(x.shape[0], out_channels, x.shape[2])
        for s in range(0, x.shape[2], step):
            out[..., s : s + step] = fn(x[..., s : s + step], *params)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, *params = ctx.saved_tensors
        leaves = [p.detach().requires_grad_(p.requires_grad) for p in params]
        wanted = [p for p in leaves if p.requires_grad]
        grads = [torch.zeros_like(p) for p in wanted]
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[3] else None
        for s in range(0, x.shape[2], ctx.step):
            part = x[..., s : s + ctx.step].detach().requires_grad_(grad_x is not None)
            with torch.enable_grad():
                y = ctx.fn(part, *leaves)
            inputs = ([part] if grad_x is not None else []) + wanted
            found = torch.autograd.grad(y, inputs, grad_out[..., s : s + ctx.step], allow_unused=True)
            if grad_x is not None:
                grad_x[..., s : s + ctx.step] = found[0]
                found = found[1:]
            for total, g in zip(grads, found, strict=True):
                if g is not None:
                    total += g
        it = iter(grads)
        return None, None, None, grad_x, *(next(it) if p.requires_grad else None for p in leaves)


def chunked_pointwise(
    fn: PointwiseFn,
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    out_channels: int,
    bytes_per_point: int,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """``fn(x, *params)`` for a pointwise ``fn`` mapping ``(b, c_in, n)`` to ``(b, out_channels, n)``, run
    on chunks of ``chunk_bytes // bytes_per_point`` points of ``x`` ``(b, c_in, *spatial)``
    (``bytes_per_point``: ``fn``'s intermediates per point; ``chunk_bytes`` defaults to ``CHUNK_BYTES`` for the device).
    Differentiable in ``x`` and ``params``: the backward pass recomputes each chunk (``fn`` must be
    deterministic). Returns ``(b, out_channels, *spatial)``."""
    flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    step = _points_per_chunk(x.device, bytes_per_point, chunk_bytes)
    out = _Chunked.apply(fn, step, out_channels, flat, *params)
    return out.view(x.shape[0], out_channels, *x.shape[2:])


def accumulate_in_place(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    x: torch.Tensor,
    y: torch.Tensor,
    non_linearity: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """``y`` (``(b, out, *spatial)``, not recorded by autograd) overwritten by ``non_linearity(y + W x + b)``
    for ``x`` ``(b, in, *spatial)``, ``W`` ``(out, in)``, ``b`` ``(out,)`` or None, and no activation for
    None: a chunk of points at a time, each read and written once while it is in cache."""
    flat_x = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    flat = y.view(y.shape[0], y.shape[1], flat_x.shape[2])
    w = weight.expand(x.shape[0], -1, -1)
    step = _resident_points(y.device, y.shape[0] * (x.shape[1] + y.shape[1]) * y.element_size())
    for s in range(0, flat.shape[2], step):
        part = flat[..., s : s + step]
        torch.baddbmm(part, w, flat_x[..., s : s + step], out=part)
        if bias is not None:
            part.add_(bias[None, :, None])
        if non_linearity is not None:
            activate_(non_linearity, part)
    return y
