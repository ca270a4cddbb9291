"""Fourier neural operators: Li et al.'s FNO, single-device or over spatially sharded fields."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F

from drift import comm
from drift.errors import PlanError
from drift.layout import Layout, to_dtensor
from drift.nn.spectral import SpectralConv, layout_of
from drift.profiling import phase
from drift.truncated import ModeSpec

PROJECTION_WIDTH = 128  # Li et al.'s hidden width of the projection
PROJECTION_CHUNK_BYTES = 64 * 2**20  # hidden activations per chunk of an unrecorded projection


class PointwiseLinear(nn.Module):
    """A 1x1 convolution on ``(batch, channels, *spatial)`` blocks, its parameters replicated on every rank.

    Initialised as ``torch.nn.Linear`` (uniform in +-1/sqrt(in)) from torch's default generator. Once
    parallelized (``mesh`` set), the parameters go through ``comm.replicate`` in the forward pass, whose
    backward all-reduces their gradients over the mesh: each rank's ``.grad`` is then the gradient of the
    global loss.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        bound = 1 / math.sqrt(in_channels)
        weight = (torch.rand(out_channels, in_channels, dtype=torch.float64) * 2 - 1) * bound
        bias = (torch.rand(out_channels, dtype=torch.float64) * 2 - 1) * bound
        self.weight = nn.Parameter(weight.to(dtype=dtype, device=device))
        self.bias = nn.Parameter(bias.to(dtype=dtype, device=device))
        self.mesh = None

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}"

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``W x + b``, plus ``add`` (a tensor shaped like the output) when given, on this rank's block."""
        weight, bias = self.weight, self.bias
        if self.mesh is not None:
            for axis in range(self.mesh.ndim):
                if self.mesh.size(axis) > 1:
                    group = self.mesh.get_group(axis)
                    weight, bias = comm.replicate(weight, group=group), comm.replicate(bias, group=group)
        flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
        weight = weight.expand(x.shape[0], -1, -1)
        recorded = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if add is None:
            # baddbmm adds the (broadcast) bias inside the gemm: one pass over the output instead of two.
            y = torch.baddbmm(bias[None, :, None], weight, flat)
        elif recorded or (add.requires_grad and torch.is_grad_enabled()) or torch.is_autocast_enabled(x.device.type):
            y = (
                torch.baddbmm(add.reshape(flat.shape[0], self.weight.shape[0], flat.shape[2]), weight, flat)
                + bias[None, :, None]
            )
        else:
            # Unrecorded: accumulate into ``add`` itself (its owner hands it over), no new full-size tensor.
            y = add.reshape(flat.shape[0], self.weight.shape[0], flat.shape[2])
            torch.baddbmm(y, weight, flat, out=y).add_(bias[None, :, None])
        return y.view(x.shape[0], self.weight.shape[0], *x.shape[2:])


def fno_block(
    spectral: SpectralConv, pointwise: PointwiseLinear, x: torch.Tensor, layout: Layout, activation: bool = True
) -> torch.Tensor:
    """One FNO block on this rank's block ``x``, ``gelu(K x + W x)`` (no GeLU when ``activation`` is
    False). The spectral output is a fresh tensor, so the pointwise gemm accumulates into it."""
    y = spectral.forward_local(x, layout)
    with phase("pointwise+gelu"):
        y = pointwise(x, add=y)
        return F.gelu(y) if activation else y


class FNO(nn.Module):
    """Li et al.'s Fourier neural operator on real ``(batch, in_channels, *spatial)`` fields of any resolution.

    A pointwise lift to ``width`` channels, ``n_layers`` blocks ``x = gelu(W x + K x)`` (W pointwise,
    K a ``SpectralConv`` keeping ``modes`` per spatial dim; no activation after the last block, as Li
    et al.), and a pointwise projection ``width -> projection_width -> out_channels`` with a GeLU
    between. Parameters are drawn from torch's default generator, the spectral weights first-to-last
    as the layers are built, so the same seed gives the same function for every method.

    Built on one device it is an ordinary module taking plain tensors; ``drift.nn.parallelize(model,
    mesh, placements)`` makes it take and return DTensors, its spectral weights sharded over the mesh.

    ``domain_padding`` (a fraction of each spatial extent, one number or one per dim, in [0, 1]) and
    ``domain_padding_mode`` ("symmetric" or "one-sided") take neuraloperator 2.0's values but pad per
    layer: every spectral convolution sees its input zero-padded by ``round(fraction * N)`` points
    and returns the N real points (``SpectralConv``); the lift, the pointwise layers and the projection
    see only real points. neuraloperator instead pads once after the lift and crops before the
    projection, so its padded region carries values from block to block: the same weights give
    different functions in the two libraries. Per-layer padding is what implicit padding (no padded
    tensor) can compute.
    ``factorization`` ("tucker" or "cp") and ``rank`` hold every spectral weight as factors
    (neuraloperator's TFNO / CP-FNO; see ``SpectralConv``).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int,
        modes: Sequence[ModeSpec],
        n_layers: int = 4,
        *,
        method: str = "drift",
        factorization: str | None = None,
        rank: float | int | Sequence[int] = 1.0,
        projection_width: int = PROJECTION_WIDTH,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        domain_padding: float | Sequence[float] | None = None,
        domain_padding_mode: str = "symmetric",
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        factory = dict(dtype=dtype, device=device)
        padding = dict(domain_padding=domain_padding, domain_padding_mode=domain_padding_mode)
        self.lift = PointwiseLinear(in_channels, width, **factory)
        self.spectral = nn.ModuleList()
        self.pointwise = nn.ModuleList()
        for _ in range(n_layers):
            factors = dict(factorization=factorization, rank=rank)
            self.spectral.append(SpectralConv(width, width, modes, method=method, **padding, **factors, **factory))
            self.pointwise.append(PointwiseLinear(width, width, **factory))
        self.project_hidden = PointwiseLinear(width, projection_width, **factory)
        self.project_out = PointwiseLinear(projection_width, out_channels, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, in_channels, *spatial)``, a plain tensor, or a DTensor once parallelized;
        returns ``(batch, out_channels, *spatial)`` alike."""
        first = self.spectral[0]
        if x.dim() != 2 + first.ndim:
            raise ValueError(f"FNO expects (batch, channels, {first.ndim} spatial dims), got shape {tuple(x.shape)}")
        dtype = self.lift.weight.dtype
        if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
            raise PlanError(
                f"FNO input is {x.dtype}, the model's parameters are {dtype}: convert one (model.to(dtype)) "
                "or run under torch.autocast"
            )
        layout, local = layout_of(x, first.ndim, first.mesh, first.input_placements)
        y = self.forward_local(local, layout)
        if isinstance(x, DTensor):
            return to_dtensor(y, x.device_mesh, x.placements, (x.shape[0], y.shape[1], *x.shape[2:]))
        return y

    def forward_local(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The model on this rank's block ``x`` ``(b, in, *layout.local_shape)``."""
        x = self.lift(x)
        for i, (spectral, pointwise) in enumerate(zip(self.spectral, self.pointwise, strict=True)):
            x = fno_block(spectral, pointwise, x, layout, activation=i < len(self.spectral) - 1)
        recorded = torch.is_grad_enabled() and (x.requires_grad or self.project_hidden.weight.requires_grad)
        if recorded or torch.is_autocast_enabled(x.device.type):
            return self.project_out(F.gelu(self.project_hidden(x)))
        return self._project_in_chunks(x)

    def _project_in_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """The projection without autograd, a chunk of points at a time: its 128-channel hidden layer,
        the largest tensor of an FNO forward, then never exists for the whole block at once."""
        flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
        out = flat.new_empty(x.shape[0], self.project_out.weight.shape[0], flat.shape[2])
        hidden = max(1, x.shape[0]) * self.project_hidden.weight.shape[0] * x.element_size()  # bytes per point
        step = max(1, PROJECTION_CHUNK_BYTES // hidden)
        for start in range(0, flat.shape[2], step):
            part = flat[..., start : start + step]
            out[..., start : start + step] = self.project_out(F.gelu(self.project_hidden(part)))
        return out.view(x.shape[0], out.shape[1], *x.shape[2:])
