"""Distributed spectral convolutions built from one global weight: DRIFT, DFNO and pruned DFNO.

All three compute, on every rank's block, the single-device FNO spectral convolution

    y = irfftn(zero_fill(einsum("bi...,io...->bo...", rfftn(x)[modes], W)), s=global_shape)

(fftn / ifftn for complex fields) with the same global weight ``W`` of shape ``(in, out, K1, ..., Kd)``
over the retained modes in ``TruncatedFFT``'s order. They differ in how the spectrum is reached and
which share of ``W`` each rank stores:

- "drift": a ``TruncatedFFT`` (partial DFTs, one reduce-scatter, one all-gather; the payload depends
  only on the number of modes); each rank holds a contiguous slice of the flattened modes.
- "dfno": Grady et al.'s baseline: a full ``DistributedFFT`` whose transposes move the whole field,
  truncation inside each rank's spectral block; each rank holds the modes its block contains.
- "dfno-pruned": a ``DistributedFFT`` with ``modes``: each local transform is truncated before the
  next transpose, so only kept modes move; each rank holds its block of the mode grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from drift import comm
from drift._plan import complex_dtype
from drift.fft import DistributedFFT
from drift.profiling import phase
from drift.truncated import ModeSpec, TruncatedFFT, mode_lists

METHODS = ("drift", "dfno", "dfno-pruned")


def spectral_weight(
    in_channels: int, out_channels: int, mode_shape: Sequence[int], seed: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Li et al.'s initial spectral weight: ``1 / (in * out)`` times uniform [0, 1) real and imaginary
    parts, ``(in, out, *mode_shape)`` complex, drawn on the CPU from ``seed`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand((in_channels, out_channels, *mode_shape), generator=g, dtype=complex_dtype(dtype))
    return w / (in_channels * out_channels)


def shared_seed(seed: int | None, group=None) -> int:
    """``seed``, or one drawn from rank 0's generator and shared with every rank when it is None."""
    if seed is not None:
        return int(seed)
    drawn = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    if comm.world_size(group) > 1:
        drawn = comm.broadcast(drawn, src=0, group=group)
    return int(drawn)


def mix_channels(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``einsum("bi...,io...->bo...", x, w)`` over per-mode channel matrices: one multiply-add per input
    channel, vectorised over the modes (several times faster on CPU than einsum's tiny batched gemms)."""
    # unbind, not indexing: its backward stacks the per-channel gradients once, where each index's
    # backward would materialise a zero tensor the size of the whole weight.
    xs, ws = x.unbind(1), w.unbind(0)
    y = xs[0].unsqueeze(1) * ws[0]
    for xi, wi in zip(xs[1:], ws[1:], strict=True):
        y = torch.addcmul(y, xi.unsqueeze(1), wi)
    return y


class SpectralConv(nn.Module):
    """A distributed FNO spectral convolution on ``(batch, in_channels, n1_loc, ..., nd_loc)`` blocks.

    Args:
        in_channels, out_channels: channel counts.
        global_shape: the global spatial extents ``(N1, ..., Nd)``, d from 1 to 4 (3D+time: d = 4).
        modes: retained modes per dim, as for ``TruncatedFFT`` (Li et al.'s k, or explicit indices).
        grid: ranks per spatial dim (the dfno methods need one dim whole).
        method: "drift", "dfno" or "dfno-pruned" (see the module docstring).
        real: real fields (rfftn / irfftn), else complex (fftn / ifftn).
        group, dtype, device: as for the plans.
        seed: the weight's seed; the same seed gives the same global weight for every method and grid.

    ``weight`` is this rank's share of the global weight (a complex Parameter): partitioned over
    ranks, its gradient needs no reduction.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        global_shape: Sequence[int],
        modes: ModeSpec | Sequence[ModeSpec],
        grid: Sequence[int],
        *,
        method: str = "drift",
        real: bool = True,
        group=None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if not 1 <= len(global_shape) <= 4:
            raise ValueError(f"SpectralConv supports 1 to 4 spatial dims, got global_shape {tuple(global_shape)}")
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channel counts must be positive, got {in_channels} and {out_channels}")
        self.in_channels, self.out_channels, self.method, self.real = in_channels, out_channels, method, real
        self.global_shape = tuple(int(n) for n in global_shape)
        self.group = group
        self.modes = mode_lists(modes, self.global_shape, real)
        self.mode_shape = tuple(len(m) for m in self.modes)
        kind = "r2c" if real else "c2c"
        common = dict(dtype=dtype, device=device, group=group)
        if method == "drift":
            self.plan = TruncatedFFT(self.global_shape, self.modes, grid, real=real, **common)
        elif method == "dfno":
            self.plan = DistributedFFT(self.global_shape, grid, kind=kind, **common)
        else:
            self.plan = DistributedFFT(self.global_shape, grid, kind=kind, modes=self.modes, **common)
        self.rank, self.world_size = self.plan.rank, self.plan.world_size
        self._shares = [self._share_index(r) for r in range(self.world_size)]
        if method == "dfno":
            # Where this rank's kept modes sit in its spectral block (a Cartesian sub-block).
            offsets = [[offset for _, offset in dim] for dim in self._modes_in_block(self.rank)]
            positions = [torch.tensor(o, dtype=torch.int64, device=self.plan.device) for o in offsets]
            self._block_index = torch.meshgrid(*positions, indexing="ij")
        w = spectral_weight(in_channels, out_channels, self.mode_shape, shared_seed(seed, group), dtype)
        self.weight = nn.Parameter(self.share_of(w.to(self.plan.device)))

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, global_shape={self.global_shape}, "
            f"mode_shape={self.mode_shape}, method={self.method!r}, rank={self.rank}/{self.world_size}"
        )

    def _modes_in_block(self, rank: int) -> list[list[tuple[int, int]]]:
        """dfno: per dim, the kept modes inside ``rank``'s spectral block as (position in the mode list,
        offset in the block)."""
        block = self.plan.output_slices(rank)
        return [
            [(p, f - s.start) for p, f in enumerate(m) if s.start <= f < s.stop]
            for m, s in zip(self.modes, block, strict=True)
        ]

    def _share_index(self, rank: int) -> tuple[torch.Tensor, tuple[int, ...]]:
        """Rank ``rank``'s share: flat indices into the row-major modes, in storage order, and its shape."""
        if self.method == "drift":
            s = self.plan.mode_slice(rank)
            return torch.arange(s.start, s.stop), (s.stop - s.start,)
        if self.method == "dfno":
            per_dim = [[p for p, _ in dim] for dim in self._modes_in_block(rank)]
        else:
            per_dim = [list(range(s.start, s.stop)) for s in self.plan.output_slices(rank)]
        shape = tuple(len(p) for p in per_dim)
        flat = torch.zeros(shape, dtype=torch.int64)
        for dim, p in enumerate(per_dim):
            stride = math.prod(self.mode_shape[dim + 1 :])
            view = [1] * len(shape)
            view[dim] = len(p)
            flat = flat + torch.tensor(p, dtype=torch.int64).view(view) * stride
        return flat.reshape(-1), shape

    def share_of(self, w: torch.Tensor) -> torch.Tensor:
        """This rank's share of a full ``(in, out, K1, ..., Kd)`` tensor (the weight, a gradient, an
        optimiser moment), shaped like ``weight``."""
        index, shape = self._shares[self.rank]
        flat = w.reshape(self.in_channels, self.out_channels, -1)
        return flat[:, :, index.to(w.device)].reshape(self.in_channels, self.out_channels, *shape)

    @torch.no_grad()
    def load_global_weight(self, w: torch.Tensor) -> None:
        """Set this rank's share from the full weight ``(in, out, K1, ..., Kd)``, given on every rank."""
        expected = (self.in_channels, self.out_channels, *self.mode_shape)
        if tuple(w.shape) != expected or w.dtype != self.weight.dtype:
            raise ValueError(
                f"global weight must be {self.weight.dtype} of shape {expected}, "
                f"got {w.dtype} of shape {tuple(w.shape)}"
            )
        self.weight.copy_(self.share_of(w.to(self.weight.device)))

    @torch.no_grad()
    def gather_shares(self, share: torch.Tensor) -> torch.Tensor:
        """The full ``(in, out, K1, ..., Kd)`` tensor on every rank from every rank's ``share`` (a tensor
        shaped like ``weight``, e.g. the weight itself or its gradient); one all-gather."""
        io = self.in_channels * self.out_channels
        flat = share.new_zeros(io, math.prod(self.mode_shape))
        if self.world_size == 1:
            flat[:, self._shares[0][0].to(flat.device)] = share.reshape(io, -1)
            return flat.view(self.in_channels, self.out_channels, *self.mode_shape)
        width = max(len(index) for index, _ in self._shares)
        mine = share.new_zeros(io, width)
        mine[:, : share[0, 0].numel()] = share.reshape(io, -1)
        every = comm.all_gather(mine.unsqueeze(0), group=self.group)
        for r, (index, _) in enumerate(self._shares):
            flat[:, index.to(flat.device)] = every[r, :, : len(index)]
        return flat.view(self.in_channels, self.out_channels, *self.mode_shape)

    def global_weight(self) -> torch.Tensor:
        """The full weight ``(in, out, K1, ..., Kd)`` on every rank (one all-gather)."""
        return self.gather_shares(self.weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, in_channels, n1_loc, ..., nd_loc)``; returns ``(batch, out_channels, ...)``."""
        if x.dim() != 2 + len(self.global_shape) or x.shape[1] != self.in_channels:
            raise ValueError(
                f"SpectralConv expects (batch, {self.in_channels}, *local block), got shape {tuple(x.shape)}"
            )
        if self.method == "drift":
            with phase("transform"):
                shares = self.plan.forward(x, out="sharded")  # (b, in, M_p)
            with phase("multiply"):
                mixed = mix_channels(shares, self.weight)
            with phase("transform"):
                return self.plan.inverse(mixed, inp="sharded")
        with phase("transform"):
            spectrum = self.plan.forward(x)
        if self.method == "dfno-pruned":
            with phase("multiply"):
                mixed = mix_channels(spectrum, self.weight)
            with phase("transform"):
                return self.plan.inverse(mixed)
        with phase("multiply"):
            kept = spectrum[(..., *self._block_index)]
            mixed = mix_channels(kept, self.weight)
            block = mixed.new_zeros(*mixed.shape[:2], *spectrum.shape[2:])
            block[(..., *self._block_index)] = mixed
        with phase("transform"):
            return self.plan.inverse(block)
