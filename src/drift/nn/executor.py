"""The fast paths of an FNO's forward on one rank's block, in one place.

Which path runs is decided by one rule, ``drift.recording.recorded``: a recorded forward (training) takes
autograd nodes that run a chunk of points at a time and allocate one block-sized tensor each way
(``drift.nn.chunked``); an unrecorded one (inference, evaluation) writes in place, into resident buffers
and into its own intermediates. Autocast and complex data take the whole-tensor paths.

- ``fno_block``: a block's ``act(K x + W x + b)``, the skip's gemm accumulating into K's output with the
  activation: the fused tail of an ``FNOBlock`` whose skip is linear and has no norm before it.
- ``channel_mlp_tail``: neuraloperator's channel MLP, its skip and the activation after them, as one node.
- ``Executor``: an FNO's resident buffers, the two activations that plain blocks write in turn and the
  projection's chunk buffers, and the projection, a chunk of points at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import cycle, repeat

import torch
from torch import nn
from torch.nn import functional as F

from drift._plan import Workspace
from drift.layout import Layout
from drift.nn.chunked import (
    accumulate_in_place,
    activate,
    branch,
    chunked_mlp,
    chunked_pointwise,
    mlp_unrecorded,
    pointwise_activation,
)
from drift.nn.pointwise import ChannelMLP, PointwiseLinear, SoftGating
from drift.nn.spectral import SpectralConv
from drift.profiling import phase
from drift.recording import autocasting, recorded
from drift.truncated import TruncatedFFT

Activation = Callable[[torch.Tensor], torch.Tensor]


def tail_fuses(mlp: ChannelMLP, skip: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``channel_mlp_tail`` runs a block's channel MLP ``mlp`` and its ``skip`` on ``x``: two layers
    drawing no dropout mask, a soft-gating or identity skip, real data outside autocast."""
    return (
        len(mlp.fcs) == 2
        and all(fc.bias is not None for fc in mlp.fcs)
        and (mlp.dropout is None or not mlp.training)
        and isinstance(skip, (SoftGating, nn.Identity))
        and not x.is_complex()
        and not autocasting(x)
    )


def channel_mlp_tail(
    mlp: ChannelMLP, skip: nn.Module, y: torch.Tensor, x: torch.Tensor, non_linearity: Activation | None
) -> torch.Tensor:
    """A neuraloperator block's tail ``act(mlp(y) + skip(x))`` (no ``act`` for None) on this rank's blocks
    ``y`` and ``x`` ``(b, width, *local)``, as one node (``chunked_mlp``): the hidden layer a chunk of points
    at a time, the skip's gain applied inside the second gemm's chunks, where the whole-tensor path makes
    the hidden layer, its activation, the gated skip and the sum each a pass over memory, forward and
    backward. Only where ``tail_fuses``."""
    params = [fc.replicated(p) for fc in mlp.fcs for p in (fc.weight, fc.bias)]
    gate = skip.replicated(skip.weight) if isinstance(skip, SoftGating) else None
    return chunked_mlp(y, *params, mlp.non_linearity, skip=x, gate=gate, out_non_linearity=non_linearity)


def fno_block(
    spectral: SpectralConv,
    pointwise: PointwiseLinear,
    x: torch.Tensor,
    layout: Layout,
    activation: bool = True,
    non_linearity: Activation = F.gelu,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One FNO block on this rank's block ``x``, ``non_linearity(K x + W x)`` (none when ``activation``
    is False). The spectral output is a fresh tensor (or ``out``: a preallocated contiguous tensor of the
    output's shape, outside autograd), so the pointwise gemm accumulates into it a chunk of points at a
    time, with the activation: in place without autograd (``accumulate_in_place``), as one autograd node
    for real data (``pointwise_activation``); complex data and autocast take ``pointwise``'s whole-tensor
    path."""
    # Outside autograd, drift adds W's bias to K's constant mode, sparing a pass over the block.
    fold = out is not None and pointwise.bias is not None and spectral.folds_constants(layout)
    autocast = autocasting(x)
    # K's and W's gradients of x are summed into a pooled tensor (drift.nn.chunked.branch).
    split = recorded(x) and not x.is_complex() and not autocast
    x_spectral, x_skip = branch(x) if split else (x, x)
    y = spectral.forward_local(x_spectral, layout, out=out, constant=pointwise.bias if fold else None)
    act = non_linearity if activation else None
    with phase("pointwise+gelu"):
        autograd = recorded(x, y, *pointwise.parameters())
        if autocast or (autograd and y.is_complex()):
            y = pointwise(x, add=y)
            return activate(non_linearity, y) if activation else y
        if autograd:
            bias = None if pointwise.bias is None else pointwise.replicated(pointwise.bias)
            return pointwise_activation(pointwise.replicated(pointwise.weight), bias, x_skip, y, act)
        # The dfno methods may return a strided block (their transposes' order), which this writes in place.
        return accumulate_in_place(pointwise.weight, None if fold else pointwise.bias, x, y.contiguous(), act)


class Executor:
    """An FNO's resident buffers and the paths that use them. The buffers live until ``clear`` (the
    model's ``to``/``cuda``/``float`` call it) or a recorded forward, which releases them so that they
    never add to a training step's memory."""

    def __init__(self) -> None:
        self._work = Workspace()
        self._scratch = Workspace()  # the drift plans' scratch, shared by the blocks (``lend``)

    def clear(self) -> None:
        self._work.clear()
        self._scratch.clear()

    def resident(self) -> list[torch.Tensor]:
        """The buffers held now: the activations and the chunk buffers of the projection and the streaming
        blocks (not the plans' scratch, which a plan's passes fill up to its work bound)."""
        return self._work.buffers()

    def lend(self, spectral: SpectralConv, layout: Layout) -> None:
        """Have ``spectral``'s plan for ``layout`` take its scratch buffers from the executor's (drift's
        plans): the blocks of an FNO run one at a time, so one set serves them all."""
        plan = spectral.plan(layout)
        if isinstance(plan, TruncatedFFT):
            plan.use_workspace(self._scratch)

    @property
    def work(self) -> Workspace:
        """The resident buffers' workspace (``drift.nn.streaming`` takes its chunk buffers from it)."""
        return self._work

    def outputs(
        self,
        x: torch.Tensor,
        width: int,
        dtype: torch.dtype,
        plain: bool,
        params: Iterator[torch.Tensor],
        activations: torch.dtype | None = None,
    ) -> tuple[bool, Iterator[torch.Tensor | None]]:
        """Whether the forward streams (``drift.nn.streaming``), and where the lift and each block after it
        write their output, for an input ``x`` ``(b, c, *spatial)``. An unrecorded forward of ``plain``
        blocks (those the streaming forward runs: ``FNOBlock.streams``) writes resident ``(b, width,
        *spatial)`` buffers, so that it allocates no block-sized tensor but its output (on the CPU a fresh
        one costs its page faults on every call: glibc maps it afresh): on real data it streams, one buffer
        (in ``activations``' precision, default ``dtype``) that every block overwrites; on complex data two
        in turn. None each otherwise (under autograd or autocast, or blocks that are not plain)."""
        autograd = recorded(x, *params)
        if autograd:
            self.clear()
        if not plain or autograd or autocasting(x) or x.numel() == 0:  # an empty batch: nothing to stream
            return False, repeat(None)
        shape = (x.shape[0], width, *x.shape[2:])
        if not x.is_complex():
            return True, repeat(self._work.get(("activation", 0), shape, activations or dtype, x.device))
        return False, cycle([self._work.get(("activation", i), shape, dtype, x.device) for i in range(2)])

    def project(
        self, hidden: PointwiseLinear, out: PointwiseLinear, non_linearity: Activation, x: torch.Tensor
    ) -> torch.Tensor:
        """The projection ``out(act(hidden(x)))`` (and, under ``recompute_mlp``, the two-layer lift) a chunk of
        points at a time: its hidden layer, the largest tensor of an FNO, never exists for the whole block,
        in the forward pass or for the backward one, which recomputes it per chunk (``chunked_mlp``; complex
        data ``chunked_pointwise``); outside autograd through resident chunk-sized buffers
        (``mlp_unrecorded``). Under autocast, in one piece."""
        if autocasting(x):
            return out(activate(non_linearity, hidden(x)))
        params = [layer.replicated(p) for layer in (hidden, out) for p in (layer.weight, layer.bias)]
        if not recorded(x, *params):
            return mlp_unrecorded(x, *params, non_linearity, self._work)
        if not x.is_complex():
            return chunked_mlp(x, *params, non_linearity)

        def mlp(part, w1, b1, w2, b2):
            h = torch.baddbmm(b1[None, :, None], w1.expand(part.shape[0], -1, -1), part)
            return torch.baddbmm(b2[None, :, None], w2.expand(part.shape[0], -1, -1), activate(non_linearity, h))

        per_point = 2 * x.shape[0] * hidden.weight.shape[0] * hidden.weight.element_size()  # h and act(h)
        return chunked_pointwise(mlp, x, params, out.weight.shape[0], per_point)
