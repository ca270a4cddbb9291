"""PDEBench's error metrics on sharded 3D+time fields, equal to the single-process values.

The definitions are those of PDEBench's ``metric_func`` (``pdebench/models/metrics.py``) for 3D data,
applied to the whole test set as one batch. For a prediction ``p`` and truth ``u`` of trajectory b,
channel c and time t on an ``nx x ny x nz`` grid (N points), with ``e = p - u``:

- RMSE: ``mean_b sqrt(mean_x e^2)``; nRMSE: ``mean_b sqrt(mean_x e^2) / sqrt(mean_x u^2)``.
- cRMSE: ``sqrt(mean_b (sum_x e)^2) / N``, the error of the conserved total.
- max error: ``max_b max_x |e|``.
- bRMSE: ``mean_b sqrt(sum of e^2 over the six faces / (2 nx ny + 2 ny nz + 2 nz nx))``: the planes
  at the first and last index of each dim (edges and corners counted once per face). PDEBench's 3D
  branch sums the channels together and then fails on its own tensors (``view`` of a permuted
  tensor); this is the per-channel form of its 1D and 2D branches.
- fRMSE: ``|fftn(e)|^2`` over the frequencies ``0 <= i < nx/2, 0 <= j < ny/2, 0 <= k < nz/2`` summed
  into radial bins ``floor(sqrt(i^2 + j^2 + k^2))`` below ``min(nx // 2, ny // 2, nz // 2)``; per bin
  ``sqrt(mean_b) / N * Lx Ly Lz``; then the mean over the bins ``[0, low)``, ``[low, high)`` and
  ``[high, ...)`` (PDEBench's ``iLow = 4``, ``iHigh = 12``). A band without bins (high on a grid under
  26 points per dim) is None where PDEBench's mean would be NaN.

Every metric is then the mean over channels and times (``per_field``: over times only).

Each rank holds blocks of the fields (``drift.Layout`` over a mesh whose non-spatial dims hold other
trajectories). It reduces its blocks to per-trajectory sums and maxima, and the spectrum's bins come
from drift's ``TruncatedFFT`` of the error's block (a reduce-scatter of the kept modes: each rank bins
its share); one sum and one max all-reduce over the default group give every rank the same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from drift import comm
from drift.layout import Layout
from drift.truncated import TruncatedFFT

BANDS = (4, 12)  # PDEBench's iLow and iHigh: the bins where the mid and high bands start
NAMES = ("rmse", "nrmse", "crmse", "max_error", "brmse", "frmse_low", "frmse_mid", "frmse_high")
_SUMS = 4  # per trajectory, channel and time: sum e^2, sum u^2, sum e, sum e^2 on the faces


class PDEBenchMetrics:
    """Accumulates PDEBench's metrics over batches of sharded blocks; ``compute`` reduces them.

    Args:
        layout: the fields' spatial dims ``(nx, ny, nz)`` and how the mesh splits them (a ``Layout``,
            e.g. ``PDEBench3D.layout``). The mesh spans the default group; its non-spatial dims hold
            other trajectories (data parallelism).
        fields: the channel names, in channel order.
        times: time steps per trajectory.
        trajectories: how many trajectories the test set holds (``update`` names them 0..n-1).
        lengths: the domain's extent per dim (PDEBench's Lx, Ly, Lz), scaling fRMSE.
        bands: where the mid and high Fourier bands start.
        device: where the accumulators live (the blocks' device).
    """

    def __init__(
        self,
        layout: Layout,
        fields: Sequence[str],
        times: int,
        trajectories: int,
        *,
        lengths: Sequence[float] = (1.0, 1.0, 1.0),
        bands: tuple[int, int] = BANDS,
        device: torch.device | str | None = None,
    ) -> None:
        if len(layout.global_shape) != 3:
            raise ValueError(f"PDEBench's 3D metrics need three spatial dims, the layout has {layout.global_shape}")
        if not 0 < bands[0] <= bands[1]:
            raise ValueError(f"bands {bands}: need 0 < low <= high")
        self.layout, self.fields, self.times, self.bands = layout, tuple(fields), times, bands
        self.lengths = tuple(float(v) for v in lengths)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        c = len(self.fields)
        self.bins = min(n // 2 for n in layout.global_shape)
        self._sums = torch.zeros(trajectories, _SUMS, c, times, dtype=torch.float64, device=self.device)
        self._spectrum = torch.zeros(trajectories, c, times, self.bins, dtype=torch.float64, device=self.device)
        # Column 0: whether the trajectory was seen; then max |e| per channel and time.
        self._maxima = torch.zeros(trajectories, 1 + c * times, dtype=torch.float64, device=self.device)
        self._plan, self._bin_of = None, None
        if self.bins > 0:
            half = [list(range(n // 2)) for n in layout.global_shape]
            self._plan = TruncatedFFT(
                layout.global_shape,
                half,
                layout.mesh,
                layout.placements,
                real=True,
                dtype=torch.float64,
                device=self.device,
            )
            i, j, k = (torch.arange(n // 2, device=self.device) for n in layout.global_shape)
            i = i[self._plan.share_slice()]
            squares = i.view(-1, 1, 1) ** 2 + j.view(1, -1, 1) ** 2 + k.view(1, 1, -1) ** 2
            # sqrt of an integer below 2^52 rounds to the correct floor.
            self._bin_of = torch.sqrt(squares.double()).floor().long().flatten()

    def update(self, pred: torch.Tensor, true: torch.Tensor, trajectories: Sequence[int]) -> None:
        """Add this rank's blocks ``pred`` and ``true`` ``(b, channels, *layout.local_shape, times)`` of the
        test trajectories ``trajectories`` (b numbers). Every rank that shares the field calls it with
        the same trajectories (the spectrum is one reduce-scatter over the spatial mesh dims)."""
        expected = (len(trajectories), len(self.fields), *self.layout.local_shape, self.times)
        if tuple(pred.shape) != expected or tuple(true.shape) != expected:
            raise ValueError(
                f"pred {tuple(pred.shape)} and true {tuple(true.shape)} must both be this rank's blocks {expected}"
            )
        if any(not 0 <= t < self._sums.shape[0] for t in trajectories):
            raise ValueError(f"trajectories {list(trajectories)}: each must be in 0..{self._sums.shape[0] - 1}")
        rows = torch.as_tensor(list(trajectories), dtype=torch.long, device=self.device)
        true = true.to(self.device, torch.float64)
        err = pred.to(self.device, torch.float64) - true
        space = (2, 3, 4)
        faces = torch.zeros(err.shape[0], err.shape[1], self.times, dtype=torch.float64, device=self.device)
        for dim, (block, n) in enumerate(zip(self.layout.local_slices, self.layout.global_shape, strict=True)):
            if block.stop == block.start:
                continue
            # The global first and last planes of this dim, where this rank's block holds them (both
            # for an extent of 1, as PDEBench's [0] and [-1]).
            if block.start == 0:
                faces += err.select(2 + dim, 0).square().sum((2, 3))
            if block.stop == n:
                faces += err.select(2 + dim, -1).square().sum((2, 3))
        sums = torch.stack([err.square().sum(space), true.square().sum(space), err.sum(space), faces], 1)
        self._sums.index_add_(0, rows, sums)
        if err.numel():  # amax needs a non-empty block
            self._maxima[rows, 1:] = torch.maximum(self._maxima[rows, 1:], err.abs().amax(space).flatten(1))
        self._maxima[rows, 0] = 1.0
        if self._plan is not None:
            spectrum = self._plan(err.permute(0, 1, 5, 2, 3, 4), sharded=True)
            power = spectrum.abs().square().flatten(3)
            kept = self._bin_of < self.bins
            binned = power.new_zeros(*power.shape[:3], self.bins)
            binned.index_add_(3, self._bin_of[kept], power[..., kept])
            self._spectrum.index_add_(0, rows, binned)

    def compute(self) -> dict:
        """The metrics over every trajectory given to ``update`` on any rank: a dict with ``NAMES`` (means
        over channels and times; a band without bins is None) and ``per_field`` (the same per channel,
        mean over times). Call on every rank of the default group: one sum and one max all-reduce."""
        c = len(self.fields)
        summed = comm.all_reduce(torch.cat([self._sums.flatten(1), self._spectrum.flatten(1)], 1))
        maxima = comm.all_reduce_max(self._maxima)
        seen = maxima[:, 0] > 0
        if not seen.any():
            raise ValueError("no test trajectory was given to update")
        sums = summed[seen, : self._sums[0].numel()].view(-1, _SUMS, c, self.times)
        spectrum = summed[seen, self._sums[0].numel() :].view(len(sums), c, self.times, self.bins)
        nx, ny, nz = self.layout.global_shape
        points, face_points = nx * ny * nz, 2 * (nx * ny + ny * nz + nz * nx)
        e2, u2, e, faces = sums.unbind(1)
        rmse = (e2 / points).sqrt()
        per_ct = dict(
            rmse=rmse.mean(0),
            nrmse=(rmse / (u2 / points).sqrt()).mean(0),
            crmse=e.square().mean(0).sqrt() / points,
            max_error=maxima[seen, 1:].view(-1, c, self.times).amax(0),
            brmse=(faces / face_points).sqrt().mean(0),
        )
        per_bin = spectrum.mean(0).sqrt() / points * math.prod(self.lengths)
        low, high = self.bands
        bands = (("frmse_low", slice(0, low)), ("frmse_mid", slice(low, high)), ("frmse_high", slice(high, None)))
        for name, bins in bands:
            band = per_bin[..., bins]
            per_ct[name] = band.mean(-1) if band.shape[-1] else None
        result = {name: None if v is None else float(v.mean()) for name, v in per_ct.items()}
        result["per_field"] = {
            field: {name: None if v is None else float(v[i].mean()) for name, v in per_ct.items()}
            for i, field in enumerate(self.fields)
        }
        return result
