"""PDEBench's error metrics on sharded fields of 1, 2 or 3 spatial dims and time, equal to the
single-process values.

The definitions are those of PDEBench's ``metric_func`` (``pdebench/models/metrics.py``), in its branch
for the fields' number of spatial dims d, applied to the whole test set as one batch. For a prediction
``p`` and truth ``u`` of trajectory b, channel c and time t on an ``n_1 x ... x n_d`` grid (N points),
with ``e = p - u``:

- RMSE: ``mean_b sqrt(mean_x e^2)``; nRMSE: ``mean_b sqrt(mean_x e^2) / sqrt(mean_x u^2)``.
- cRMSE: ``sqrt(mean_b (sum_x e)^2) / N``, the error of the conserved total.
- max error: ``max_b max_x |e|``.
- bRMSE: ``mean_b sqrt(sum of e^2 on the boundary / B)``, the boundary being the first and last index
  of each dim: in 1D the two end points (B = 2), in 2D the four edges (B = 2 nx + 2 ny), in 3D the six
  faces (B = 2 nx ny + 2 ny nz + 2 nz nx). A point on several of them counts once for each (corners),
  and an extent of 1 counts its one plane twice (PDEBench's ``[0]`` and ``[-1]``). PDEBench's 3D branch
  sums the channels together and then fails on its own tensors (``view`` of a permuted tensor); drift
  uses the per-channel form of its 1D and 2D branches.
- fRMSE: per bin ``sqrt(mean_b P) / N * L_1 ... L_d`` (``lengths``: PDEBench's Lx, Ly, Lz), then the mean
  over the bins ``[0, low)``, ``[low, high)`` and ``[high, ...)`` (PDEBench's ``iLow = 4``,
  ``iHigh = 12``). The bins differ with d, as in PDEBench:

  - 1D: ``P = |rfft(e)|^2`` at each frequency ``0 <= i <= nx // 2`` (the whole half spectrum, Nyquist
    included), one bin per frequency: ``nx // 2 + 1`` bins.
  - 2D and 3D: ``|fftn(e)|^2`` at the frequencies ``0 <= i_k < n_k / 2`` summed into radial bins
    ``floor(sqrt(i_1^2 + ... + i_d^2))`` below ``min(n_k // 2)`` (none on a grid with an extent of 1).

  A band without bins (high: on fewer than 24 points in 1D, or with a dim of fewer than 26 points in 2D
  and 3D) is None where PDEBench's mean would be NaN.

Every metric is then the mean over channels and times (``per_field``: over times only). ``per_frame``
gives RMSE and nRMSE per time (predicted frame), means over channels: a rollout's error growth.

Each rank holds blocks of the fields (``drift.Layout`` over a mesh whose non-spatial dims hold other
trajectories). It reduces its blocks to per-trajectory sums and maxima, and the spectrum's bins come
from drift's ``TruncatedFFT`` of the error's block (a reduce-scatter of the kept modes: each rank bins
its share); one sum and one max all-reduce over the default group give every rank the same result.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from drift import comm
from drift.layout import Layout
from drift.truncated import TruncatedFFT

BANDS = (4, 12)  # PDEBench's iLow and iHigh: the bins where the mid and high bands start
NAMES = ("rmse", "nrmse", "crmse", "max_error", "brmse", "frmse_low", "frmse_mid", "frmse_high")
PER_FRAME = ("rmse", "nrmse")  # the metrics ``compute`` also reports per time
_SUMS = 4  # per trajectory, channel and time: sum e^2, sum u^2, sum e, sum e^2 on the boundary


def _binned_frequencies(shape: tuple[int, ...]) -> tuple[list[int], int]:
    """PDEBench's binned frequencies ``range(k)`` per dim (the count k) and its number of bins for a grid
    of extents ``shape``: in 1D rfft's whole half spectrum, one bin per frequency; in 2D and 3D the
    frequencies below ``n / 2`` per dim, radial bins below ``min(n // 2)``."""
    if len(shape) == 1:
        return [shape[0] // 2 + 1], shape[0] // 2 + 1
    return [n // 2 for n in shape], min(n // 2 for n in shape)


def _is_int(value) -> bool:
    return not isinstance(value, bool) and hasattr(value, "__index__")


def _int_at_least(value, minimum: int, what: str) -> int:
    if not _is_int(value) or operator.index(value) < minimum:
        raise ValueError(f"{what} must be an int of at least {minimum}, got {value!r}")
    return operator.index(value)


def _positive_finite(value) -> bool:
    try:
        return 0 < float(value) < math.inf
    except (TypeError, ValueError):
        return False


class PDEBenchMetrics:
    """Accumulates PDEBench's metrics over batches of sharded blocks; ``compute`` reduces them.

    Args:
        layout: the fields' 1, 2 or 3 spatial dims (e.g. ``(nx, ny, nz)``) and how the mesh splits them
            (a ``Layout``, e.g. ``PDEBench3D.layout``). The mesh spans the default group; its non-spatial
            dims hold other trajectories (data parallelism).
        fields: the channel names, in channel order (at least one, distinct: ``per_field`` is keyed by them).
        times: time steps (predicted frames) per trajectory, at least 1.
        trajectories: how many trajectories the test set holds (``update`` names them 0..n-1), at least 1.
        lengths: the domain's extent per spatial dim (PDEBench's Lx, Ly, Lz), scaling fRMSE; one positive
            number per dim of ``layout``. None: 1.0 for each.
        bands: ints ``(low, high)``, ``0 < low <= high``: the bins where the mid and high Fourier bands start.
        device: where the accumulators live (the blocks' device).

    Every argument is checked here (ValueError naming what was given and what was expected); nothing
    here communicates.
    """

    def __init__(
        self,
        layout: Layout,
        fields: Sequence[str],
        times: int,
        trajectories: int,
        *,
        lengths: Sequence[float] | None = None,
        bands: tuple[int, int] = BANDS,
        device: torch.device | str | None = None,
    ) -> None:
        shape = layout.global_shape
        d = len(shape)
        if not 1 <= d <= 3:
            raise ValueError(f"PDEBench's metrics need 1, 2 or 3 spatial dims, the layout has {d}: {shape}")
        fields = tuple(fields)
        if not fields or len(set(fields)) != len(fields):
            raise ValueError(f"fields {fields}: need at least one channel name, each distinct")
        times = _int_at_least(times, 1, "times")
        trajectories = _int_at_least(trajectories, 1, "trajectories")
        lengths = (1.0,) * d if lengths is None else tuple(lengths)
        if len(lengths) != d or not all(_positive_finite(v) for v in lengths):
            raise ValueError(f"lengths {lengths}: need one positive finite extent per spatial dim of {shape} ({d})")
        if len(bands) != 2 or not all(_is_int(b) for b in bands) or not 0 < bands[0] <= bands[1]:
            raise ValueError(f"bands {bands}: need ints (low, high) with 0 < low <= high")
        self.layout, self.fields, self.times, self.bands = layout, fields, times, tuple(map(operator.index, bands))
        self.lengths = tuple(float(v) for v in lengths)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        c = len(self.fields)
        counts, self.bins = _binned_frequencies(shape)
        self._sums = torch.zeros(trajectories, _SUMS, c, times, dtype=torch.float64, device=self.device)
        self._spectrum = torch.zeros(trajectories, c, times, self.bins, dtype=torch.float64, device=self.device)
        # Column 0: whether the trajectory was seen; then max |e| per channel and time.
        self._maxima = torch.zeros(trajectories, 1 + c * times, dtype=torch.float64, device=self.device)
        self._plan = self._kept = self._bin_of = None
        if self.bins > 0:
            self._plan = TruncatedFFT(
                shape,
                [list(range(k)) for k in counts],
                layout.mesh,
                layout.placements,
                real=True,
                dtype=torch.float64,
                device=self.device,
            )
            frequencies = [torch.arange(k, device=self.device) for k in counts]
            frequencies[0] = frequencies[0][self._plan.share_slice()]
            squares = sum(f.square() for f in torch.meshgrid(*frequencies, indexing="ij"))
            # sqrt of an integer below 2^52 rounds to the correct floor.
            bin_of = torch.sqrt(squares.double()).floor().long().flatten()
            self._kept = torch.nonzero(bin_of < self.bins).flatten()
            self._bin_of = bin_of[self._kept]

    def update(self, pred: torch.Tensor, true: torch.Tensor, trajectories: Sequence[int]) -> None:
        """Add this rank's blocks ``pred`` and ``true`` ``(b, channels, *layout.local_shape, times)`` (real)
        of the test trajectories ``trajectories`` (b distinct numbers, none given to this rank before).
        Every rank that shares the field calls it with the same trajectories (the spectrum is one
        reduce-scatter over the spatial mesh dims). Checks its arguments before that collective
        (ValueError naming what was given and what was expected)."""
        trajectories = list(trajectories)
        expected = (len(trajectories), len(self.fields), *self.layout.local_shape, self.times)
        if tuple(pred.shape) != expected or tuple(true.shape) != expected:
            raise ValueError(
                f"pred {tuple(pred.shape)} and true {tuple(true.shape)} must both be this rank's blocks {expected} "
                "(trajectories, channels, *local spatial extents, times)"
            )
        if pred.is_complex() or true.is_complex():
            raise ValueError(f"pred ({pred.dtype}) and true ({true.dtype}) must be real")
        n = self._sums.shape[0]
        if not all(_is_int(t) and 0 <= t < n for t in trajectories):
            raise ValueError(f"trajectories {trajectories}: each must be an int in 0..{n - 1}")
        trajectories = [operator.index(t) for t in trajectories]
        if len(set(trajectories)) != len(trajectories):
            raise ValueError(f"trajectories {trajectories}: each may appear once")
        rows = torch.as_tensor(trajectories, dtype=torch.long, device=self.device)
        again = [t for t, seen in zip(trajectories, self._maxima[rows, 0].tolist(), strict=True) if seen]
        if again:
            raise ValueError(f"trajectories {again} were already given to this rank: each is added once")
        true = true.to(self.device, torch.float64)
        err = pred.to(self.device, torch.float64) - true
        space = tuple(range(2, 2 + len(self.layout.global_shape)))
        boundary = err.new_zeros(err.shape[0], err.shape[1], self.times)
        for dim, (block, n) in enumerate(zip(self.layout.local_slices, self.layout.global_shape, strict=True)):
            if block.stop == block.start:
                continue
            # The global first and last planes of this dim, where this rank's block holds them (both
            # for an extent of 1, as PDEBench's [0] and [-1]).
            if block.start == 0:
                boundary += err.narrow(2 + dim, 0, 1).square().sum(space)
            if block.stop == n:
                boundary += err.narrow(2 + dim, block.stop - block.start - 1, 1).square().sum(space)
        sums = torch.stack([err.square().sum(space), true.square().sum(space), err.sum(space), boundary], 1)
        self._sums.index_add_(0, rows, sums)
        if err.numel():  # amax needs a non-empty block
            self._maxima[rows, 1:] = torch.maximum(self._maxima[rows, 1:], err.abs().amax(space).flatten(1))
        self._maxima[rows, 0] = 1.0
        if self._plan is not None:
            spectrum = self._plan(err.movedim(-1, 2), sharded=True)  # (b, c, t, *this rank's share)
            power = spectrum.abs().square().flatten(3)[..., self._kept]
            binned = power.new_zeros(*power.shape[:3], self.bins)
            binned.index_add_(3, self._bin_of, power)
            self._spectrum.index_add_(0, rows, binned)

    def compute(self) -> dict:
        """The metrics over every trajectory given to ``update`` on any rank: a dict with ``NAMES`` (means
        over channels and times; a band without bins is None), ``per_field`` (per channel name, the same
        means over times) and ``per_frame`` (per name of ``PER_FRAME``, a list of one value per time: the
        mean over channels). Call on every rank of the default group: one sum and one max all-reduce."""
        c = len(self.fields)
        summed = comm.all_reduce(torch.cat([self._sums.flatten(1), self._spectrum.flatten(1)], 1))
        maxima = comm.all_reduce_max(self._maxima)
        seen = maxima[:, 0] > 0
        if not seen.any():
            raise ValueError("no test trajectory was given to update")
        sums = summed[seen, : self._sums[0].numel()].view(-1, _SUMS, c, self.times)
        spectrum = summed[seen, self._sums[0].numel() :].view(len(sums), c, self.times, self.bins)
        shape = self.layout.global_shape
        points = math.prod(shape)
        boundary_points = sum(2 * math.prod(shape[:i] + shape[i + 1 :]) for i in range(len(shape)))
        e2, u2, e, boundary = sums.unbind(1)
        rmse = (e2 / points).sqrt()
        per_ct = dict(
            rmse=rmse.mean(0),
            nrmse=(rmse / (u2 / points).sqrt()).mean(0),
            crmse=e.square().mean(0).sqrt() / points,
            max_error=maxima[seen, 1:].view(-1, c, self.times).amax(0),
            brmse=(boundary / boundary_points).sqrt().mean(0),
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
        result["per_frame"] = {name: per_ct[name].mean(0).tolist() for name in PER_FRAME}
        return result
