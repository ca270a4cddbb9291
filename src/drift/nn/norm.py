"""Instance and group normalisation over the global field of spatially sharded blocks.

``F.instance_norm`` and ``nn.GroupNorm(1, c)`` (neuraloperator's "instance_norm" and "group_norm") take
their mean and variance over the whole field; a rank holds only its block. Each rank sums ``x`` and
``x^2`` over its block, one all-reduce (per spatial mesh dim) adds the sums of every block of a field,
and each rank normalises its block with the global statistics: the single-device function.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from drift.layout import Layout
from drift.nn.replicated import Replicated

NORMS = ("group_norm", "instance_norm", None)
EPS = 1e-5  # torch's (and neuraloperator's) default


class GlobalNorm(Replicated):
    """``kind`` "instance_norm" (per sample and channel, no affine parameters, as neuraloperator's
    ``InstanceNorm``) or "group_norm" (one group: per sample over channels and space, then a per-channel
    affine map initialised to the identity, as ``nn.GroupNorm(1, channels)``) of real ``(b, c, *spatial)``
    blocks of a field laid out as ``layout``. Biased variance, ``eps`` inside the square root."""

    def __init__(
        self,
        kind: str,
        channels: int,
        *,
        eps: float = EPS,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if kind not in NORMS[:2]:
            raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
        self.kind, self.eps = kind, eps
        if kind == "group_norm":
            dtype = dtype or torch.get_default_dtype()
            self.weight = nn.Parameter(torch.ones(channels, dtype=dtype, device=device))
            self.bias = nn.Parameter(torch.zeros(channels, dtype=dtype, device=device))

    def extra_repr(self) -> str:
        return f"{self.kind!r}, eps={self.eps}"

    def forward_local(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """This rank's block ``x`` ``(b, c, *layout.local_shape)`` normalised with the field's statistics."""
        d = len(layout.global_shape)
        dims = tuple(range(2, 2 + d)) if self.kind == "instance_norm" else tuple(range(1, 2 + d))
        count = math.prod(layout.global_shape) * (1 if self.kind == "instance_norm" else x.shape[1])
        # Half-precision blocks (under autocast) are summed in float32.
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
        sums = torch.stack([wide.sum(dims, keepdim=True), wide.square().sum(dims, keepdim=True)])
        mean, square = layout.all_reduce(sums) / count
        y = (x - mean) * torch.rsqrt(square - mean.square() + self.eps)
        if self.kind == "instance_norm":
            return y
        shape = (-1, *[1] * d)
        return y * self.replicated(self.weight).view(shape) + self.replicated(self.bias).view(shape)
