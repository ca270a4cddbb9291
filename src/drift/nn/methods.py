"""The spectral convolution methods, one class each: how a ``SpectralConv`` reaches the retained modes on
a layout (its plan), which share of the weight a rank stores (its placements) and multiplies, and the
convolution itself. ``method_named`` maps the names ``SpectralConv(method=...)`` takes to them; nothing
else looks at a method's name.

- ``Drift`` ("drift"): a ``TruncatedFFT`` (partial DFTs, one reduce-scatter, one all-gather; the payload
  depends only on the number of modes); the weight is sharded on K1 (``Shard(2)`` on every spatial mesh
  dim). Pads implicitly (its bases) and takes a reduction mesh and overlap.
- ``PrunedDfno`` ("dfno-pruned"): a ``DistributedFFT`` with ``modes``: each local transform is truncated
  before the next transpose, so only kept modes move; the weight is sharded as the mode grid's blocks.
- ``Dfno`` ("dfno"): Grady et al.'s baseline, a full ``DistributedFFT`` whose transposes move the whole
  field, and truncation inside each rank's spectral block. Its blocks hold kept modes in no
  ``torch.chunk`` pattern, so the weight is replicated (each rank uses its modes; the gradient is summed
  over ranks).
The dfno methods pad the tensor (``drift.nn.padding``), so they refuse padding on a dim split over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from drift.cost import drift_cost, pruned_dfno_cost
from drift.errors import PlanError
from drift.fft import DistributedFFT, pruned_output_placements
from drift.layout import Layout
from drift.nn.mixing import mix_channels
from drift.nn.padding import crop_block, pad_block
from drift.profiling import phase
from drift.truncated import TruncatedFFT


class SpectralMethod:
    """One way to compute a spectral convolution; stateless (a plan holds what a layout needs).

    ``plan(layer, layout, modes, padding)``: the resident plan for inputs laid out as ``layout``, with
    ``modes`` kept per dim of the padded extents and ``padding`` ``(before, after)`` per dim.
    ``weight_placements(layer, mesh, placements, spatial_axes)``: how ``layer`` stores its weight over
    ``mesh`` for inputs ``(batch, channels, *spatial)`` placed as ``placements``, ``spatial_axes`` the
    mesh dims that split a spatial dim.
    ``weight_index(plan)``: the index into ``(in, out, K1, ..., Kd)`` of the part a rank multiplies
    (for a factorized weight, which rebuilds only it); ``select(w, plan)``: that part of the rank's
    stored weight ``w``. ``convolve(layer, plan, x, w, padding, out, constant)``: the output.
    """

    name: str
    pads_tensor = True  # pads the input tensor, so a dim split over ranks cannot be padded
    takes_reduction = False  # a reduction mesh and overlap for the spectrum's collectives
    needs_whole_dim = True  # a DistributedFFT: some dim must be whole on every rank
    cost = None  # drift.cost's model of it (a function of a Problem), if method="auto" may choose it

    def plan(self, layer, layout: Layout, modes, padding) -> nn.Module:
        raise NotImplementedError

    def weight_placements(self, layer, mesh, placements: Sequence, spatial_axes: Sequence[int]) -> tuple:
        raise NotImplementedError

    def weight_index(self, plan: nn.Module) -> tuple:
        raise NotImplementedError

    def select(self, w: torch.Tensor, plan: nn.Module) -> torch.Tensor:
        return w

    def folds_constants(self, plan: nn.Module) -> bool:
        """Whether ``convolve`` adds ``constant`` in the spectrum (its constant mode)."""
        return False

    def convolve(self, layer, plan, x, w, padding, out=None, constant=None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self.name)


class Drift(SpectralMethod):
    name = "drift"
    pads_tensor = False
    takes_reduction = True
    needs_whole_dim = False
    cost = staticmethod(drift_cost)

    def plan(self, layer, layout, modes, padding) -> nn.Module:
        options = dict(padding=padding, reduction=layer.reduction, overlap=layer.overlap)
        where = dict(real=layer.real, dtype=layer.precision(), device=layer.weight.device)
        return TruncatedFFT(layout.global_shape, modes, layout.mesh, layout.placements, **options, **where)

    def weight_placements(self, layer, mesh, placements, spatial_axes) -> tuple:
        return tuple(Shard(2) if axis in spatial_axes else Replicate() for axis in range(mesh.ndim))

    def weight_index(self, plan) -> tuple:
        return (None, None, plan.share_slice())

    def folds_constants(self, plan) -> bool:
        return plan.has_constant_mode

    def convolve(self, layer, plan, x, w, padding, out=None, constant=None) -> torch.Tensor:
        with phase("transform"):
            shares = plan(x, sharded=True)  # (b, in, k1_loc, K2, ..., Kd)
        with phase("multiply"):
            mixed = mix_channels(shares, w)
            if constant is not None:
                plan.add_constant_(mixed, constant, sharded=True)
        with phase("transform"):
            return plan.inverse(mixed, sharded=True, out=out)


class PrunedDfno(SpectralMethod):
    name = "dfno-pruned"
    cost = staticmethod(pruned_dfno_cost)

    def plan(self, layer, layout, modes, padding) -> nn.Module:
        plan = DistributedFFT(
            _padded(layout, padding),
            layout.mesh,
            layout.placements,
            kind="r2c" if layer.real else "c2c",
            modes=modes,
            dtype=layer.precision(),
            device=layer.weight.device,
        )
        if isinstance(layer.weight, DTensor):
            expected = self._stored(plan.output_placements, layer.data_axes)
            if tuple(layer.weight.placements) != expected:
                raise PlanError(
                    f"dfno-pruned at resolution {layout.global_shape} places the modes as {expected}, the weight "
                    f"is sharded as {tuple(layer.weight.placements)}: parallelize for this resolution"
                )
        return plan

    @staticmethod
    def _stored(output_placements: Sequence, data_axes: Sequence[int]) -> tuple:
        """The weight's placements: the mode grid's blocks as the plan's output has them."""
        return tuple(
            Replicate() if axis in data_axes or not isinstance(p, Shard) else Shard(p.dim + 2)
            for axis, p in enumerate(output_placements)
        )

    def weight_placements(self, layer, mesh, placements, spatial_axes) -> tuple:
        # The transform's placements: Shard(i) over spatial dim i (the inputs' Shard(2 + i)).
        spatial = [Shard(p.dim - 2) if axis in spatial_axes else Replicate() for axis, p in enumerate(placements)]
        return self._stored(pruned_output_placements(mesh, spatial, layer.mode_shape, layer.real), ())

    def weight_index(self, plan) -> tuple:
        return (None, None, *plan.output_slices())

    def convolve(self, layer, plan, x, w, padding, out=None, constant=None) -> torch.Tensor:
        with phase("transform"):
            spectrum = plan(pad_block(x, padding))
        with phase("multiply"):
            mixed = mix_channels(spectrum, w)
        with phase("transform"):
            y = crop_block(plan.inverse(mixed), padding)
        return y if out is None else out.copy_(y)


class DfnoPlan(nn.Module):
    """A full ``DistributedFFT`` and where the kept modes lie in this rank's spectral block: per dim their
    ``positions`` in the weight's mode dims and their ``offsets`` in the block (as a meshgrid)."""

    def __init__(self, fft: DistributedFFT, modes: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.fft = fft
        positions, offsets = [], []
        for kept, s in zip(modes, fft.output_slices(), strict=True):
            inside = [(p, f - s.start) for p, f in enumerate(kept) if s.start <= f < s.stop]
            positions.append(torch.tensor([p for p, _ in inside], dtype=torch.int64))
            offsets.append(torch.tensor([o for _, o in inside], dtype=torch.int64))
        self.positions = tuple(positions)
        self.offsets = torch.meshgrid(*offsets, indexing="ij")


class Dfno(SpectralMethod):
    name = "dfno"

    def plan(self, layer, layout, modes, padding) -> nn.Module:
        kind = "r2c" if layer.real else "c2c"
        fft = DistributedFFT(
            _padded(layout, padding),
            layout.mesh,
            layout.placements,
            kind=kind,
            dtype=layer.precision(),
            device=layer.weight.device,
        )
        return DfnoPlan(fft, modes)

    def weight_placements(self, layer, mesh, placements, spatial_axes) -> tuple:
        return (Replicate(),) * mesh.ndim

    def weight_index(self, plan) -> tuple:
        return (None, None, *plan.positions)

    def select(self, w, plan) -> torch.Tensor:
        positions = torch.meshgrid(*plan.positions, indexing="ij")
        return w[(slice(None), slice(None), *(p.to(w.device) for p in positions))]

    def convolve(self, layer, plan, x, w, padding, out=None, constant=None) -> torch.Tensor:
        with phase("transform"):
            spectrum = plan.fft(pad_block(x, padding))
        with phase("multiply"):
            device = spectrum.device
            index = (..., *(o.to(device) for o in plan.offsets))
            mixed = mix_channels(spectrum[index], w)
            block = mixed.new_zeros(*mixed.shape[:2], *spectrum.shape[2:])
            block[index] = mixed
        with phase("transform"):
            y = crop_block(plan.fft.inverse(block), padding)
        return y if out is None else out.copy_(y)


def _padded(layout: Layout, padding) -> tuple[int, ...]:
    return tuple(n + b + a for n, (b, a) in zip(layout.global_shape, padding, strict=True))


_METHODS = {m.name: m for m in (Drift(), Dfno(), PrunedDfno())}
METHODS = ("drift", "dfno", "dfno-pruned")  # the names, in the order they are documented


def candidates(*, padded_split: bool = False, drift_options: bool = False, every_dim_split: bool = False) -> tuple:
    """The methods ``method="auto"`` may choose (those with a cost model) for a layer that pads a split
    dim, on a model given drift's reduction or overlap, on a mesh that splits every dim."""
    return tuple(
        m
        for m in _METHODS.values()
        if m.cost is not None
        and not (padded_split and m.pads_tensor)
        and not (drift_options and not m.takes_reduction)
        and not (every_dim_split and m.needs_whole_dim)
    )


def method_named(name: str) -> SpectralMethod:
    """The method called ``name``; ValueError naming the choices otherwise."""
    try:
        return _METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"method must be one of {METHODS}, got {name!r}") from None
