"""One FNO layer as a module with named parts: ``FNOBlock``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F

from drift.layout import Layout, to_dtensor
from drift.modes import ModeSpec
from drift.nn.chunked import activate, branch
from drift.nn.executor import channel_mlp_tail, fno_block, tail_fuses
from drift.nn.norm import GlobalNorm
from drift.nn.pointwise import ChannelMLP, PointwiseLinear, skip_connection
from drift.nn.spectral import SpectralConv, layout_of
from drift.recording import recorded


class FNOBlock(nn.Module):
    """One FNO layer on ``(b, width, *spatial)`` fields, in neuraloperator's FNOBlocks order
    (post-activation): ``y = act(norm(K x) + skip(x))``, then, with a channel MLP or a norm,
    ``act(mlp_norm(channel_mlp(y) + channel_mlp_skip(x)))`` (the channel MLP's terms only with one).
    ``act`` is ``non_linearity`` (on real and imaginary parts apart for complex data), none after the
    last block of a model (``activation=False``).

    Parts, None where the options leave them out:

    - ``spectral``: K, a ``SpectralConv`` keeping ``modes`` (``method``, ``factorization``, ``rank``,
      ``domain_padding`` and ``domain_padding_mode`` are its own).
    - ``skip``: ``fno_skip`` of x ("linear" W x, "identity", "soft-gating"). The block's bias is K's,
      or, for a linear skip with no norm between, the skip's: then the block's tail ``act(K x + W x + b)``
      runs fused (``drift.nn.executor.fno_block``).
    - ``norm`` (after K) and ``mlp_norm`` (last): ``GlobalNorm`` of kind ``norm``, statistics over the
      global field.
    - ``channel_mlp``: a two-layer ``ChannelMLP`` with ``channel_mlp_hidden`` channels (0: none),
      dropout ``channel_mlp_dropout``, and ``channel_mlp_skip`` of x.

    ``recompute_mlp``: the tail ``act(channel_mlp(y) + channel_mlp_skip(x))`` runs as one node that keeps
    ``y`` and ``x`` alone and recomputes the hidden layer in the backward pass
    (``drift.nn.executor.channel_mlp_tail``): fewer fields kept and fewer passes over memory, the same
    function and gradients up to rounding. Where ``tail_fuses`` (two layers, no dropout mask drawn, a
    soft-gating or identity skip, real data outside autocast) and there is no ``mlp_norm``; elsewhere the
    parts run as modules.

    The parts are built in this order from torch's default generator, so a seed gives the same block
    whatever the method.
    """

    def __init__(
        self,
        width: int,
        modes: Sequence[ModeSpec],
        *,
        activation: bool = True,
        non_linearity: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
        method: str = "drift",
        factorization: str | None = None,
        rank: float | int | Sequence[int] = 1.0,
        domain_padding: float | Sequence[float] | None = None,
        domain_padding_mode: str = "symmetric",
        fno_skip: str = "linear",
        channel_mlp_hidden: int = 0,
        channel_mlp_dropout: float = 0.0,
        channel_mlp_skip: str = "soft-gating",
        norm: str | None = None,
        complex_data: bool = False,
        recompute_mlp: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.activation, self.non_linearity = activation, non_linearity
        self.recompute_mlp = recompute_mlp
        factory = dict(dtype=dtype, device=device)
        pointwise = dict(complex_data=complex_data, **factory)
        fused = fno_skip == "linear" and norm is None
        self.spectral = SpectralConv(
            width,
            width,
            modes,
            method=method,
            real=not complex_data,
            bias=not fused,
            factorization=factorization,
            rank=rank,
            domain_padding=domain_padding,
            domain_padding_mode=domain_padding_mode,
            **factory,
        )
        if fno_skip == "linear":
            self.skip = PointwiseLinear(width, width, bias=fused, **pointwise)
        else:
            self.skip = skip_connection(fno_skip, width, **pointwise)
        self.channel_mlp = self.channel_mlp_skip = None
        if channel_mlp_hidden:
            self.channel_mlp = ChannelMLP(width, width, channel_mlp_hidden, dropout=channel_mlp_dropout, **pointwise)
            self.channel_mlp_skip = skip_connection(channel_mlp_skip, width, **pointwise)
        self.norm = GlobalNorm(norm, width, **factory) if norm else None
        self.mlp_norm = GlobalNorm(norm, width, **factory) if norm else None

    @property
    def fused(self) -> bool:
        """Whether the block's tail ``act(K x + W x + b)`` runs fused: a linear skip, no norm after K."""
        return isinstance(self.skip, PointwiseLinear) and self.norm is None

    @property
    def plain(self) -> bool:
        """Whether the block is Li et al.'s ``act(K x + W x + b)`` alone: fused, no channel MLP."""
        return self.fused and self.channel_mlp is None

    @property
    def streams(self) -> bool:
        """Whether the streaming forward (``drift.nn.streaming``) runs the block: fused, and its channel MLP
        (if any) draws no dropout mask."""
        mlp = self.channel_mlp
        return self.fused and (mlp is None or mlp.dropout is None or not self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, width, *spatial)``, a plain tensor, or a DTensor once parallelized; returns the
        same shape alike."""
        layout, local = layout_of(x, self.spectral.ndim, self.spectral.mesh, self.spectral.input_placements)
        y = self.forward_local(local, layout)
        if isinstance(x, DTensor):
            return to_dtensor(y, x.device_mesh, x.placements, x.shape)
        return y

    def forward_local(self, x: torch.Tensor, layout: Layout, out: torch.Tensor | None = None) -> torch.Tensor:
        """The block on this rank's block ``x`` ``(b, width, *layout.local_shape)``. ``out``: where a plain
        block writes its output outside autograd (a contiguous tensor shaped as ``x``; see
        ``drift.nn.executor``)."""
        mlp, act = self.channel_mlp, self.non_linearity if self.activation else None
        tail = (
            self.recompute_mlp
            and mlp is not None
            and self.mlp_norm is None
            and tail_fuses(mlp, self.channel_mlp_skip, x)
        )
        x_tail = x
        if tail and recorded(x):  # the tail's gradient of x and the block's summed into a pooled tensor
            x, x_tail = branch(x)
        if self.fused:
            y = fno_block(self.spectral, self.skip, x, layout, self.activation, self.non_linearity, out=out)
        else:
            y = self.spectral.forward_local(x, layout)
            if self.norm is not None:
                y = self.norm.forward_local(y, layout)
            y = y + self.skip(x)
            if self.activation:
                y = activate(self.non_linearity, y)
        if tail:
            return channel_mlp_tail(mlp, self.channel_mlp_skip, y, x_tail, act)
        if self.channel_mlp is None and self.mlp_norm is None:
            return y
        if self.channel_mlp is not None:
            y = self.channel_mlp(y) + self.channel_mlp_skip(x)
        if self.mlp_norm is not None:
            y = self.mlp_norm.forward_local(y, layout)
        return activate(self.non_linearity, y) if self.activation else y
