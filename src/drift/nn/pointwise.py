"""Pointwise (channel-mixing) layers: 1x1 convolutions, neuraloperator's ChannelMLP and skip connections.

Each acts on every point alone, so a rank applies it to its own block with no communication; the
parameters are replicated (``Replicated``). With ``complex_data`` the layers are complex-affine and the
non-linearity acts on the real and imaginary parts separately (neuraloperator's CGELU for GeLU).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from drift._plan import complex_dtype
from drift.nn.chunked import activate, linear_into, pointwise_activation
from drift.nn.replicated import Replicated
from drift.recording import autocasting, recorded

SKIPS = ("linear", "identity", "soft-gating")


def _uniform(shape: tuple[int, ...], bound: float, complex_data: bool) -> torch.Tensor:
    """Uniform in +-bound (each of the real and imaginary parts when complex), float64 / complex128."""
    draw = torch.rand(shape, dtype=torch.float64) * 2 - 1
    if complex_data:
        draw = torch.complex(draw, torch.rand(shape, dtype=torch.float64) * 2 - 1)
    return draw * bound


class PointwiseLinear(Replicated):
    """A 1x1 convolution on ``(batch, channels, *spatial)`` blocks, its parameters replicated on every rank.

    Initialised as ``torch.nn.Linear`` (uniform in +-1/sqrt(in)) from torch's default generator; with
    ``complex_data`` the weight and bias are complex (both parts drawn so). Once parallelized, the
    parameters go through ``replicated`` in the forward pass, whose backward all-reduces their
    gradients over the mesh: each rank's ``.grad`` is then the gradient of the global loss.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        bias: bool = True,
        complex_data: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        if complex_data:
            dtype = complex_dtype(dtype)
        bound = 1 / math.sqrt(in_channels)
        factory = dict(dtype=dtype, device=device)
        self.weight = nn.Parameter(_uniform((out_channels, in_channels), bound, complex_data).to(**factory))
        # Drawn even without a bias, so the layers after it get the same draws either way.
        b = _uniform((out_channels,), bound, complex_data).to(**factory)
        self.bias = nn.Parameter(b) if bias else None

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}, bias={self.bias is not None}"

    def forward(
        self, x: torch.Tensor, add: torch.Tensor | None = None, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``W x + b``, plus ``add`` (a tensor shaped like the output) when given, on this rank's block;
        written into ``out`` when given (a preallocated contiguous tensor of the output's shape and
        dtype, outside autograd, without ``add``)."""
        weight = self.replicated(self.weight)
        bias = self.bias if self.bias is None else self.replicated(self.bias)
        autograd = recorded(x, self.weight)
        if autograd and out is None and not x.is_complex() and not autocasting(x):
            # One autograd node in chunks of points, its output and x's gradient from drift.memory.
            return pointwise_activation(weight, bias, x, add, None)
        shape = (x.shape[0], self.weight.shape[0], *x.shape[2:])
        if out is not None:
            if autograd or add is not None or tuple(out.shape) != shape or not out.is_contiguous():
                raise ValueError(
                    f"PointwiseLinear: out= takes a contiguous tensor of shape {shape}, outside autograd and "
                    f"without add=; got shape {tuple(out.shape)}"
                )
            return linear_into(weight, bias, x, out)
        flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
        weight = weight.expand(x.shape[0], -1, -1)
        if bias is None:
            if add is None:
                return torch.bmm(weight, flat).view(shape)
            return torch.baddbmm(add.reshape(flat.shape[0], -1, flat.shape[2]), weight, flat).view(shape)
        if add is None:
            # baddbmm adds the (broadcast) bias inside the gemm: one pass over the output instead of two.
            y = torch.baddbmm(bias[None, :, None], weight, flat)
        elif autograd or recorded(add) or autocasting(x):
            y = (
                torch.baddbmm(add.reshape(flat.shape[0], self.weight.shape[0], flat.shape[2]), weight, flat)
                + bias[None, :, None]
            )
        else:
            # Unrecorded: accumulate into ``add`` itself (its owner hands it over), no new full-size tensor.
            y = add.reshape(flat.shape[0], self.weight.shape[0], flat.shape[2])
            torch.baddbmm(y, weight, flat, out=y).add_(bias[None, :, None])
        return y.view(shape)


class SoftGating(Replicated):
    """neuraloperator's soft-gating skip: ``x * w`` with one gain per channel, initialised to one."""

    def __init__(
        self,
        channels: int,
        *,
        complex_data: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        if complex_data:
            dtype = complex_dtype(dtype)
        self.weight = nn.Parameter(torch.ones(channels, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, c, *spatial)`` scaled per channel."""
        return x * self.replicated(self.weight).view(-1, *[1] * (x.dim() - 2))


def skip_connection(kind: str, channels: int, *, complex_data: bool = False, dtype=None, device=None) -> nn.Module:
    """neuraloperator's skip connections: "linear" (a 1x1 convolution without bias), "identity" or
    "soft-gating" (``SoftGating``)."""
    if kind not in SKIPS:
        raise ValueError(f"skip connection must be one of {SKIPS}, got {kind!r}")
    factory = dict(complex_data=complex_data, dtype=dtype, device=device)
    if kind == "linear":
        return PointwiseLinear(channels, channels, bias=False, **factory)
    if kind == "soft-gating":
        return SoftGating(channels, **factory)
    return nn.Identity()


class ChannelMLP(nn.Module):
    """neuraloperator's ChannelMLP: ``n_layers`` pointwise layers with ``non_linearity`` between them and
    dropout (``dropout`` > 0) after each, on ``(b, in, *spatial)`` blocks.

    Dropout draws each rank's mask for its own block, so a parallelized model in training mode does not
    reproduce the single-device masks; in eval mode it is the identity.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int,
        n_layers: int = 2,
        *,
        non_linearity: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
        dropout: float = 0.0,
        complex_data: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if n_layers < 1 or min(in_channels, out_channels, hidden_channels) < 1:
            raise ValueError(
                f"ChannelMLP needs at least one layer and positive widths, got n_layers={n_layers}, "
                f"channels {in_channels} -> {hidden_channels} -> {out_channels}"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"channel_mlp_dropout must be in [0, 1), got {dropout!r}")
        widths = [in_channels, *[hidden_channels] * (n_layers - 1), out_channels]
        factory = dict(complex_data=complex_data, dtype=dtype, device=device)
        self.fcs = nn.ModuleList(PointwiseLinear(a, b, **factory) for a, b in zip(widths[:-1], widths[1:], strict=True))
        self.non_linearity = non_linearity
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < len(self.fcs) - 1:
                x = activate(self.non_linearity, x)
            if self.dropout is not None:
                x = self.dropout(x)
        return x
