"""Distributed Fourier neural operators: Li et al.'s FNO over spatially sharded fields."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from drift import comm
from drift.nn.spectral import SpectralConv, shared_seed
from drift.profiling import phase
from drift.truncated import ModeSpec

PROJECTION_WIDTH = 128  # Li et al.'s hidden width of the projection
PROJECTION_CHUNK_BYTES = 64 * 2**20  # hidden activations per chunk of an unrecorded projection


class PointwiseLinear(nn.Module):
    """A 1x1 convolution on ``(batch, channels, *spatial)`` blocks, its parameters replicated on every rank.

    Initialised as ``torch.nn.Linear`` (uniform in +-1/sqrt(in)) from ``generator``. In the forward pass
    the parameters go through ``comm.replicate``, whose backward all-reduces their gradients: each rank's
    ``.grad`` is then the gradient of the global loss.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        generator: torch.Generator,
        *,
        group=None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        bound = 1 / math.sqrt(in_channels)
        weight = (torch.rand(out_channels, in_channels, generator=generator, dtype=torch.float64) * 2 - 1) * bound
        bias = (torch.rand(out_channels, generator=generator, dtype=torch.float64) * 2 - 1) * bound
        self.weight = nn.Parameter(weight.to(dtype=dtype, device=device))
        self.bias = nn.Parameter(bias.to(dtype=dtype, device=device))
        self.group = group

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``W x + b``, plus ``add`` (a tensor shaped like the output) when given."""
        weight, bias = self.weight, self.bias
        if comm.world_size(self.group) > 1:
            weight, bias = comm.replicate(weight, group=self.group), comm.replicate(bias, group=self.group)
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        weight = weight.expand(x.shape[0], -1, -1)
        if add is None:
            # baddbmm adds the (broadcast) bias inside the gemm: one pass over the output instead of two.
            y = torch.baddbmm(bias[None, :, None], weight, flat)
        elif torch.is_grad_enabled() and (add.requires_grad or x.requires_grad or self.weight.requires_grad):
            y = torch.baddbmm(add.reshape(flat.shape[0], -1, flat.shape[2]), weight, flat) + bias[None, :, None]
        else:
            # Unrecorded: accumulate into ``add`` itself (its owner hands it over), no new full-size tensor.
            y = add.reshape(flat.shape[0], -1, flat.shape[2])
            torch.baddbmm(y, weight, flat, out=y).add_(bias[None, :, None])
        return y.view(x.shape[0], -1, *x.shape[2:])


def fno_block(spectral: SpectralConv, pointwise: PointwiseLinear, x: torch.Tensor, activation: bool = True):
    """One FNO block, ``gelu(K x + W x)`` (no GeLU when ``activation`` is False). The spectral output is
    a fresh tensor, so the pointwise gemm accumulates into it."""
    y = spectral(x)
    with phase("pointwise+gelu"):
        y = pointwise(x, add=y)
        return F.gelu(y) if activation else y


class FNO(nn.Module):
    """Li et al.'s Fourier neural operator on ``(batch, in_channels, n1_loc, ..., nd_loc)`` blocks.

    A pointwise lift to ``width`` channels, ``n_layers`` blocks ``x = gelu(W x + K x)`` (W pointwise,
    K a ``SpectralConv``; no activation after the last block, as Li et al.), and a pointwise projection
    ``width -> 128 -> out_channels`` with a GeLU between. The same ``seed`` gives the same global
    parameters for every method and grid, so models on different grids compute the same function.

    Replicated parameters (lift, W, projection) have their gradients all-reduced by their backward
    (``PointwiseLinear``); the partitioned spectral weights need none. ``global_state()`` and
    ``load_global_state()`` move a single-device state dict in and out on any grid.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int,
        modes: ModeSpec | Sequence[ModeSpec],
        global_shape: Sequence[int],
        grid: Sequence[int],
        *,
        n_layers: int = 4,
        method: str = "drift",
        real: bool = True,
        group=None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        g = torch.Generator().manual_seed(shared_seed(seed, group))
        factory = dict(dtype=dtype, device=device)
        self.lift = PointwiseLinear(in_channels, width, g, group=group, **factory)
        self.spectral = nn.ModuleList()
        self.pointwise = nn.ModuleList()
        for _ in range(n_layers):
            layer_seed = int(torch.randint(0, 2**62, (1,), generator=g))
            self.spectral.append(
                SpectralConv(
                    width,
                    width,
                    global_shape,
                    modes,
                    grid,
                    method=method,
                    real=real,
                    group=group,
                    seed=layer_seed,
                    **factory,
                )
            )
            self.pointwise.append(PointwiseLinear(width, width, g, group=group, **factory))
        self.project_hidden = PointwiseLinear(width, PROJECTION_WIDTH, g, group=group, **factory)
        self.project_out = PointwiseLinear(PROJECTION_WIDTH, out_channels, g, group=group, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x)
        for i, (spectral, pointwise) in enumerate(zip(self.spectral, self.pointwise, strict=True)):
            x = fno_block(spectral, pointwise, x, activation=i < len(self.spectral) - 1)
        if torch.is_grad_enabled() and (x.requires_grad or self.project_hidden.weight.requires_grad):
            return self.project_out(F.gelu(self.project_hidden(x)))
        return self._project_in_chunks(x)

    def _project_in_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """The projection without autograd, a chunk of points at a time: its 128-channel hidden layer,
        the largest tensor of an FNO forward, then never exists for the whole block at once."""
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        out = flat.new_empty(x.shape[0], self.project_out.weight.shape[0], flat.shape[2])
        step = max(1, PROJECTION_CHUNK_BYTES // (x.shape[0] * PROJECTION_WIDTH * x.element_size()))
        for start in range(0, flat.shape[2], step):
            part = flat[..., start : start + step]
            out[..., start : start + step] = self.project_out(F.gelu(self.project_hidden(part)))
        return out.view(x.shape[0], -1, *x.shape[2:])

    def global_state(self) -> dict[str, torch.Tensor]:
        """A single-device state dict (the full spectral weights), the same on every rank."""
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        for i, layer in enumerate(self.spectral):
            state[f"spectral.{i}.weight"] = layer.global_weight()
        return state

    def load_global_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a single-device state dict (from ``global_state`` on any grid) given on every rank."""
        own = self.state_dict()
        if set(state) != set(own):
            raise ValueError(
                f"state keys differ: missing {sorted(set(own) - set(state))}, extra {sorted(set(state) - set(own))}"
            )
        for name, value in own.items():
            if not name.startswith("spectral.") and (
                state[name].shape != value.shape or state[name].dtype != value.dtype
            ):
                raise ValueError(
                    f"state[{name!r}] must be {value.dtype} of shape {tuple(value.shape)}, "
                    f"got {state[name].dtype} of shape {tuple(state[name].shape)}"
                )
        with torch.no_grad():
            for i, layer in enumerate(self.spectral):
                layer.load_global_weight(state[f"spectral.{i}.weight"])
            for name, value in own.items():
                if not name.startswith("spectral."):
                    value.copy_(state[name])
