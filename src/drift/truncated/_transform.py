"""The Distributed Truncated Spectral Transform (DTST): only the retained Fourier modes of a sharded field.

Rank p holds the block x_p of a global field x (``N1 x ... x Nd``) at offsets ``o``. Its partial
spectrum at the retained frequencies ``S = S1 x ... x Sd`` is one matrix product per dim,

    X_p = B_1 ... B_d x_p,    B_i[k, j] = exp(-2 pi i S_i[k] (o_i + j) / N_i),

and the spectrum is the sum of the partial spectra over ranks: an all-reduce, or a reduce-scatter
when every rank keeps only its share of the modes (a chunk of the first mode dim), whose payload is
the number of retained modes, whatever the grid extents. The inverse applies the adjoint bases to the
retained spectrum and needs no communication once every rank holds it.

For a real field, ``B_i[N - f] = conj(B_i[f])`` at every offset, so the partial spectrum at -f is the
conjugate of that at f: the first (real) stage computes each such pair of kept frequencies once
(``conjugate_fold``), as real rows (the real parts, then the imaginary parts) that the second stage takes
as they are: a real gemm with its basis' real and imaginary parts (half a complex gemm's FLOPs), whose
output is expanded to the kept modes of both dims. The inverse mirrors it: its second-to-last stage folds
each pair before a real gemm, and its last stage is a real gemm.

Zero padding is implicit: padding dim i with ``b_i`` zeros before and ``a_i`` after the field only
changes its basis (extent ``N_i + b_i + a_i``, offsets shifted by ``b_i``), and the inverse is evaluated
on the N_i real points alone, so no padded tensor exists and the communication is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from drift import comm, memory
from drift._plan import (
    ComplexModule,
    Workspace,
    check_input,
    chunk_bound,
    complex_dtype,
    real_dtype,
    resolve_device,
)
from drift.errors import PlanError
from drift.layout import Layout, dtensor_layout, reduction_mesh, shift_placements, to_dtensor
from drift.modes import ModeSpec, PaddingSpec, mode_lists, padding_pairs
from drift.recording import recorded
from drift.truncated._contraction import plan_orders, slab_order
from drift.truncated._maps import GatherMap, LinearMap, ScatterMap
from drift.truncated._overlap import compute_then_send, receive_then_compute
from drift.truncated._stages import Fold, Stage, apply_stage, conjugate_fold

_NORMS = ("backward", "ortho", "forward")
# The bound on a chunk's intermediates in the passes autograd does not record (4 complex values of the widest
# extents a row takes, a loose bound: the resident buffers hold a fraction of it). On the CPU 64 MiB, so that
# chunks stay near the cache; elsewhere a chunk costs a few dozen kernel launches and their dispatch on the
# host (on a GPU one row a chunk made a block several times slower than cuFFT: docs/benchmarks/gpu.md), so the
# whole batch goes at once unless it is huge.
WORK_BYTES = {"cpu": 64 * 2**20}
OTHER_DEVICES_WORK_BYTES = 8 * 2**30


def _reduction_mesh(layout: Layout, shape: Sequence[int]) -> DeviceMesh | None:
    """The reduction mesh of ``shape`` for ``layout``'s field (None on one device, where nothing is summed)."""
    if layout.mesh is None:
        if math.prod(tuple(shape)) != 1:
            raise ValueError(f"reduction {tuple(shape)} needs a mesh: without one the field is on one rank")
        return None
    return reduction_mesh(layout.mesh, layout.spatial_axes, shape)


class TruncatedFFT(ComplexModule):
    """A resident plan for the retained Fourier modes of a field sharded over a DeviceMesh.

    Args:
        global_shape: extents ``(N1, ..., Nd)`` of the transformed (last d) dims.
        modes: per dim an int k or an explicit sequence of frequency indices (see ``mode_indices``)
            of the padded extent; a bare int applies to every dim.
        mesh: a ``DeviceMesh`` (any number of dims), or None for one device.
        placements: one per mesh dim, as for a DTensor of shape ``global_shape`` (``Shard(i)`` splits
            transformed dim i in ``torch.chunk`` blocks; see ``drift.Layout``). Default: all Replicate.
        real: real input and ``rfftn`` semantics (half spectrum on the last dim), else complex ``fftn``.
        dtype: the real precision, ``torch.float32`` or ``torch.float64``. A real plan takes real input
            of that dtype, a complex plan complex input of the matching complex dtype. ``.to()``,
            ``.double()`` and ``.float()`` convert the plan (its bases are non-persistent buffers).
        device: where the bases live and where inputs must be.
        norm: "backward", "ortho" or "forward", as in ``torch.fft``.
        strict: if False, inputs of another floating dtype or device are converted to the plan's;
            a wrong local shape is an error either way.
        padding: implicit zero padding (``padding_pairs``): an int p (p zeros after every dim), or per
            dim an int p or a pair ``(before, after)``, at most N zeros a side. ``forward`` gives the
            retained modes of the transform of the padded field (``torch.nn.functional.pad`` then
            ``fftn``; norms use the padded extents), ``inverse`` the inverse transform over the padded
            extents at the N real points only (``ifftn`` then a crop). Layouts, inputs and outputs keep
            the real extents; no padded tensor is made and the collectives are unchanged.
        reduction: how the sharded spectrum is summed and joined over the ranks that share the field:
            None, one reduce-scatter (all-gather) per spatial mesh dim; a mesh shape over those ranks
            whose consecutive entries split each spatial mesh dim, e.g. ``(8, 4)`` for a slab of 32
            ranks on 8 nodes of 4, reduced over its last dim first (within a node, then across: latency
            sum(P_i - 1) alpha instead of (P - 1) alpha, the same bytes); or a ``drift.reduction_mesh``.
            The shares, and so the results, are the same whatever it is. It applies to the sharded
            forward and inverse (the replicated forward all-reduces per spatial mesh dim). A shape that
            does not factor the rank count so is a ValueError before any collective.
        overlap: the sharded forward's reduce-scatter and the sharded inverse's all-gather (and their
            adjoints in the backward) run in this many pieces of the batch's fields (``drift.truncated._overlap``),
            each piece's collective overlapping the next piece's transform. 1: no overlap. The results
            are the same whatever it is.

    Inputs are this rank's block (a plain tensor ``(*batch, *layout.local_shape)``) or a DTensor of the
    global field with the plan's mesh and placements (outputs are then DTensors too).

    Attributes: ``layout`` (a ``drift.Layout``), ``padding`` (``(before, after)`` per dim),
    ``padded_shape`` (the transform's extents), ``modes`` (kept indices per dim), ``mode_shape``
    ``(K1, ..., Kd)``, ``num_modes`` M, ``local_shape``, ``local_slices``, ``order`` (the forward's dims
    in contraction order: FLOPs plus its interleaving copy, ``_contraction.best_order``), ``inverse_order`` (the
    forward order whose reverse the inverse and the forward's adjoint contract in, chosen with their
    costlier copy), ``flops`` and ``inverse_flops`` (real FLOPs of the local forward and inverse for one
    field).

    Example, on one device (on a mesh each rank passes its block and gets the same spectrum):

    >>> import torch, drift
    >>> plan = drift.TruncatedFFT((16, 12), modes=(3, 2), dtype=torch.float64)
    >>> plan.modes
    ((0, 1, 2, 13, 14, 15), (0, 1))
    >>> x = torch.randn(4, 16, 12, dtype=torch.float64)
    >>> spectrum = plan.forward(x)
    >>> spectrum.shape
    torch.Size([4, 6, 2])
    >>> rfft = torch.fft.rfftn(x, dim=(-2, -1))
    >>> torch.allclose(spectrum, rfft[:, [0, 1, 2, 13, 14, 15]][..., :2])
    True
    >>> plan.inverse(spectrum).shape
    torch.Size([4, 16, 12])
    """

    @torch.inference_mode(False)  # bases built during an inference pass must serve training later
    def __init__(
        self,
        global_shape: Sequence[int],
        modes: ModeSpec | Sequence[ModeSpec],
        mesh=None,
        placements: Sequence | None = None,
        *,
        real: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        norm: str = "backward",
        strict: bool = True,
        padding: PaddingSpec | None = None,
        reduction: Sequence[int] | DeviceMesh | None = None,
        overlap: int = 1,
    ) -> None:
        super().__init__()
        cdtype = complex_dtype(dtype)
        if not isinstance(overlap, int) or overlap < 1:
            raise ValueError(f"overlap must be a positive number of pieces, got {overlap!r}")
        self.overlap = overlap
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
        layout = Layout(global_shape, mesh, placements)
        if reduction is not None and not isinstance(reduction, DeviceMesh):
            reduction = _reduction_mesh(layout, reduction)
        self.layout = Layout(global_shape, mesh, placements, reduction) if reduction is not None else layout
        self.global_shape = self.layout.global_shape
        self.padding = padding_pairs(padding, self.global_shape)
        self.padded_shape = tuple(n + b + a for n, (b, a) in zip(self.global_shape, self.padding, strict=True))
        self.modes = mode_lists(modes, self.padded_shape, real)
        self.real = real
        self.norm = norm
        self.strict = strict
        self.mode_shape = tuple(len(m) for m in self.modes)
        self.num_modes = math.prod(self.mode_shape)
        self.local_slices = self.layout.local_slices
        self.local_shape = self.layout.local_shape
        forward, inverse = plan_orders(self.local_shape, self.modes, self.padded_shape, real)
        (self.order, self.flops), (self.inverse_order, self.inverse_flops) = forward, inverse
        device = resolve_device(device)
        self._build_stages(dtype, cdtype, device)
        self._workspace = Workspace()
        self.work_bytes: int | None = None  # None: WORK_BYTES for the plan's device

    @property
    def dtype(self) -> torch.dtype:
        """The real precision the plan computes in."""
        return real_dtype(getattr(self, self._forward_stages[0].name).dtype)

    @property
    def complex_dtype(self) -> torch.dtype:
        return complex_dtype(self.dtype)

    @property
    def device(self) -> torch.device:
        return getattr(self, self._forward_stages[0].name).device

    def extra_repr(self) -> str:
        padded = f", padding={self.padding}" if any(b or a for b, a in self.padding) else ""
        reduction = "" if self.layout.reduction is None else f", reduction={tuple(self.layout.reduction.shape)}"
        reduction += "" if self.overlap == 1 else f", overlap={self.overlap}"
        return (
            f"global_shape={self.global_shape}{padded}, mode_shape={self.mode_shape}, "
            f"layout={self.layout.placements}, real={self.real}, dtype={self.dtype}, norm={self.norm!r}, "
            f"order={self.order}, inverse_order={self.inverse_order}{reduction}"
        )

    def _before_conversion(self) -> None:
        self._workspace.clear()

    @torch.inference_mode(False)  # bases rebuilt during an inference pass must serve training later
    def _after_conversion(self) -> None:
        """After a conversion the bases are rebuilt from float64 in the new precision and place, so a
        plan made in float32 and converted by ``.double()`` is exact in float64."""
        dtype, device = self.dtype, self.device
        if dtype in (torch.float32, torch.float64):
            self._build_stages(dtype, complex_dtype(dtype), device)

    def _build_stages(self, dtype, cdtype, device) -> None:
        """The four maps' stages: forward and inverse-adjoint contract in ``order``'s direction (real input
        first), inverse and forward-adjoint in ``inverse_order``'s reverse (real output last); a map whose
        order differs from its partner's gets its own bases, built for the adjoint only."""
        self._forward_stages = self._build_forward(dtype, cdtype, device, self.order, "forward")
        self._inverse_stages = self._build_inverse(dtype, cdtype, device, self.inverse_order, "inverse")
        if self.inverse_order == self.order:
            forward, inverse = self._forward_stages, self._inverse_stages
        else:
            forward = self._build_forward(dtype, cdtype, device, self.inverse_order, "forward_for_adjoint")
            inverse = self._build_inverse(dtype, cdtype, device, self.order, "inverse_for_adjoint")
        self._forward_adjoint = self._adjoint(forward, self.local_shape)
        self._inverse_adjoint = self._adjoint(inverse, self.mode_shape)
        self._slab_stages: tuple[Stage, ...] | None = None  # inverse_slab's, built on first use

    def _basis(self, dim: int, frequencies: Sequence[int] | None = None) -> torch.Tensor:
        """B_dim[k, j] = exp(-2 pi i f_k (b + o + j) / N) in float64 over the padded extent N, the block's
        points placed after the b leading zeros; phases reduced exactly mod N. ``frequencies``: the f_k
        (default: the kept modes)."""
        n_padded = self.padded_shape[dim]
        f = torch.tensor(self.modes[dim] if frequencies is None else frequencies, dtype=torch.int64)
        start = self.padding[dim][0] + self.local_slices[dim].start
        j = torch.arange(start, start + self.local_shape[dim], dtype=torch.int64)
        phase = (f[:, None] * j[None, :]) % n_padded
        angle = phase.to(torch.float64) * (-2 * math.pi / n_padded)
        return torch.polar(torch.ones_like(angle), angle)

    def _scale(self, dim: int, inverse: bool) -> float:
        n = self.padded_shape[dim]
        if self.norm == "ortho":
            return 1 / math.sqrt(n)
        return 1 / n if (self.norm == "forward") != inverse else 1.0

    def _is_innermost(self, dim: int, sizes: Sequence[int]) -> bool:
        return math.prod(sizes[dim + 1 :]) == 1

    def _stage(self, m: torch.Tensor, device, stage: Stage) -> Stage:
        """``stage``, its matrix ``m`` registered as buffer ``stage.name`` with its adjoint (``_adjoint``)
        beside it."""
        self.register_buffer(stage.name, m.contiguous().to(device), persistent=False)
        adjoint = m.mH if m.is_complex() else m.T
        self.register_buffer(f"{stage.name}_adjoint", adjoint.contiguous().to(device), persistent=False)
        return stage

    def _adjoint(self, stages: tuple[Stage, ...], sizes: Sequence[int]) -> tuple[Stage, ...]:
        """The stages of the adjoint map of ``stages`` (which take extents ``sizes``): the adjoint of each
        stage in reverse order, a real-in stage becoming real-out (the real part of ``M^H g``) and back, a
        fold_expand stage fold_reduce and back."""
        extents, ins = list(sizes), []
        for stage in stages:
            ins.append(extents[stage.dim])
            extents = stage.extents(extents)
        swap = {
            "fold_expand": "fold_reduce",
            "fold_reduce": "fold_expand",
            "real_in": "real_out",
            "real_out": "real_in",
        }
        return tuple(
            replace(stage, name=f"{stage.name}_adjoint", kind=swap.get(stage.kind, stage.kind), out=n)
            for stage, n in zip(reversed(stages), reversed(ins), strict=True)
        )

    def _build_forward(self, dtype, cdtype, device, order, prefix: str) -> tuple[Stage, ...]:
        stages = []
        sizes = list(self.local_shape)
        folded: tuple[int, Fold] | None = None  # a real stage's dim and rows, which the next stage takes
        for step, dim in enumerate(order):
            right = self._is_innermost(dim, sizes)
            k, name = self.mode_shape[dim], f"{prefix}_basis_{step}"
            if self.real and step == 0 and not right:
                fold = conjugate_fold(self.modes[dim], self.padded_shape[dim])
                b = self._basis(dim, fold.frequencies) * self._scale(dim, inverse=False)
                # (fold.rows, n): the folded frequencies' real rows, then their nonzero imaginary rows.
                m = torch.cat((b.real, b.imag[list(fold.imaginary)])).to(dtype)
                stage = Stage(dim, name, False, "real", fold.rows)
                folded = (dim, fold)
            else:
                b = self._basis(dim) * self._scale(dim, inverse=False)  # (k, n)
                if self.real and step == 0:  # (n, 2k), real and imaginary columns interleaved
                    m = torch.view_as_real(b.T.contiguous()).reshape(-1, 2 * k).to(dtype)
                    stage = Stage(dim, name, right, "real_in", k)
                elif folded is not None:  # (2k, n), the real parts' rows, then the imaginary parts'
                    m = torch.cat((b.real, b.imag))
                    m = (m.T if right else m).to(dtype)
                    stage = Stage(dim, name, right, "fold_expand", k, folded[1], folded[0])
                    folded = None
                else:
                    m = (b.T if right else b).to(cdtype)
                    stage = Stage(dim, name, right, "complex", k)
            stages.append(self._stage(m, device, stage))
            sizes = stage.extents(sizes)
        return tuple(stages)

    def _build_inverse(self, dtype, cdtype, device, order, prefix: str) -> tuple[Stage, ...]:
        stages = []
        sizes = list(self.mode_shape)
        dims = tuple(reversed(order))
        last, d = dims[-1], len(dims)
        # A real field whose last dim is not innermost: the stage before the last folds its pairs.
        fold = None
        if self.real and not self._is_innermost(last, self.local_shape):
            fold = conjugate_fold(self.modes[last], self.padded_shape[last])
        for step, dim in enumerate(dims):
            right = self._is_innermost(dim, sizes)
            n, name = self.local_shape[dim], f"{prefix}_basis_{step}"
            frequencies = fold.frequencies if fold is not None and dim == last else self.modes[dim]
            e = self._basis(dim, frequencies).conj().T * self._scale(dim, inverse=True)  # (n, k)
            if self.real and dim == d - 1:
                e = e * self._half_spectrum_weights(frequencies)
            if self.real and step == d - 1 and fold is not None:
                # Re(e @ z) = e.real @ z.real - e.imag @ z.imag: z's pairs folded into real rows.
                m = torch.cat((e.real, -e.imag[:, list(fold.imaginary)]), dim=1).to(dtype)
                stage = Stage(dim, name, False, "real", n)
            elif self.real and step == d - 1:  # (2k, n), real and imaginary rows interleaved
                m = torch.stack((e.real.T, -e.imag.T), dim=1).reshape(2 * len(frequencies), n).to(dtype)
                stage = Stage(dim, name, right, "real_out", n)
            elif fold is not None and step == d - 2:  # (n, 2k), for the real parts' rows, then the imaginary
                m = torch.cat((e.real, -e.imag), dim=1)
                m = (m.T if right else m).to(dtype)
                stage = Stage(dim, name, right, "fold_reduce", n, fold, last)
            else:
                m = (e.T if right else e).to(cdtype)
                stage = Stage(dim, name, right, "complex", n)
            stages.append(self._stage(m, device, stage))
            sizes = stage.extents(sizes)
        return tuple(stages)

    @torch.inference_mode(False)  # bases built during an inference pass must serve later calls outside it
    def _build_slab_stages(self) -> tuple[Stage, ...]:
        order = slab_order(self.local_shape, self.modes, self.padded_shape, self.real)
        return self._build_inverse(self.dtype, self.complex_dtype, self.device, order, "inverse_slab")

    def _half_spectrum_weights(self, frequencies: Sequence[int]) -> torch.Tensor:
        """irfft's weights on the last dim: 1 for DC and an even (padded) extent's Nyquist, 2 for the others."""
        n = self.padded_shape[-1]
        return torch.tensor([1.0 if f == 0 or 2 * f == n else 2.0 for f in frequencies], dtype=torch.float64)

    def share_slice(self, coordinate: Sequence[int] | None = None) -> slice:
        """The slice of the first mode dim (``range(K1)``) a rank holds in the sharded spectrum: K1 in
        ``torch.chunk`` blocks over each spatial mesh dim in turn (this rank's, or the rank at mesh
        ``coordinate``)."""
        return self.layout.share_slice(self.mode_shape[0], coordinate)

    @property
    def share_shape(self) -> tuple[int, ...]:
        """This rank's block of the sharded spectrum: ``(k1_local, K2, ..., Kd)``."""
        s = self.share_slice()
        return (s.stop - s.start, *self.mode_shape[1:])

    def _check(self, t: torch.Tensor, what: str, shape: tuple[int, ...], complex_input: bool) -> torch.Tensor:
        dtype = self.complex_dtype if complex_input else self.dtype
        return check_input(t, what, comm.rank(), shape, dtype, self.device, self.strict)

    def _run(self, stages: tuple[Stage, ...], t: torch.Tensor, name: str, adjoint: tuple[Stage, ...]) -> torch.Tensor:
        """Apply ``stages`` in turn to ``t`` (``(rows, ...)``); ``adjoint``: the stages of the adjoint map.

        Every pass runs in chunks of rows whose intermediates fit ``work_bytes``, staged through the
        plan's resident workspace, the last stage writing each chunk straight into the (fresh) result.
        Autograd records the map as one linear node (``_maps.LinearMap``) that saves nothing: its backward
        applies the adjoint stages the same way.
        """
        if recorded(t):
            return LinearMap.apply(self, stages, adjoint, name, t)
        return self._run_chunks(stages, t, name)

    def chunk_rows(self, stages: tuple[Stage, ...], sizes: Sequence[int], rows: int) -> int:
        """Rows (fields) per chunk when ``stages`` map ``rows`` fields of extents ``sizes``: as many as keep
        a chunk's intermediates within ``work_bytes`` (None: ``WORK_BYTES`` for the plan's device), at least one."""
        sizes, widest = list(sizes), math.prod(sizes)
        for stage in stages:
            sizes = stage.extents(sizes)
            widest = max(widest, math.prod(sizes), 1)
        budget = self.work_bytes or chunk_bound(WORK_BYTES, OTHER_DEVICES_WORK_BYTES, self.device)
        return max(1, min(rows, budget // (4 * widest * self.complex_dtype.itemsize)))

    def _run_chunks(
        self,
        stages: tuple[Stage, ...],
        t: torch.Tensor,
        name: str,
        out: torch.Tensor | None = None,
        matrices: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        matrices = matrices or [getattr(self, stage.name) for stage in stages]
        rows, chunk = t.shape[0], self.chunk_rows(stages, t.shape[1:], t.shape[0])
        result = self._result(stages, rows, t.shape[1:], t.device, out)
        for start in range(0, rows, chunk):
            piece = t[start : start + chunk]
            for i, stage in enumerate(stages):
                target = result[start : start + chunk] if i == len(stages) - 1 else None
                piece = apply_stage(piece, stage, matrices[i], self._workspace, (name, i), out=target)
        return result

    def _result(
        self, stages: tuple[Stage, ...], rows: int, sizes: Sequence[int], device, out: torch.Tensor | None
    ) -> torch.Tensor:
        """The tensor ``stages`` write ``rows`` fields of extents ``sizes`` into: ``out`` viewed so, or fresh."""
        sizes = list(sizes)
        for stage in stages:
            sizes = stage.extents(sizes)
        if out is not None:
            return out.view(rows, *sizes)
        return memory.empty(
            (rows, *sizes), self.dtype if stages[-1].kind in ("real_out", "real") else self.complex_dtype, device
        )

    def _scatter(self, stages: tuple[Stage, ...], adjoint, name: str, t: torch.Tensor) -> torch.Tensor:
        """``stages`` on ``t`` ``(rows, ...)`` into ``(rows, *mode_shape)``, then this rank's shares of the
        sum over ranks ``(rows, *share_shape)`` (``Layout.reduce_scatter_shares``), in ``overlap`` pieces."""
        if recorded(t):
            return ScatterMap.apply(self, stages, adjoint, name, t)
        return self._scatter_pieces(stages, t, name)

    def _scatter_pieces(self, stages: tuple[Stage, ...], t: torch.Tensor, name: str) -> torch.Tensor:
        def compute(rows: slice) -> torch.Tensor:
            return self._run_chunks(stages, t[rows], name).view(-1, *self.mode_shape)

        return compute_then_send(t.shape[0], self.overlap, compute, self.layout.reduce_scatter_shares)

    def _gather(
        self, stages: tuple[Stage, ...], adjoint, name: str, t: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Every rank's shares ``t`` ``(rows, *share_shape)`` joined into ``(rows, *mode_shape)``
        (``Layout.all_gather_shares``), then ``stages`` on them (into ``out``), in ``overlap`` pieces."""
        if recorded(t):
            return GatherMap.apply(self, stages, adjoint, name, t)
        return self._gather_pieces(stages, t, name, out)

    def _gather_pieces(
        self, stages: tuple[Stage, ...], t: torch.Tensor, name: str, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        result = self._result(stages, t.shape[0], self.mode_shape, t.device, out)
        receive_then_compute(
            t.shape[0],
            self.overlap,
            lambda rows: self.layout.all_gather_shares(t[rows], self.mode_shape[0]),
            lambda rows, spectrum: self._run_chunks(stages, spectrum, name, result[rows]),
        )
        return result

    def partial_spectrum(self, x_local: torch.Tensor) -> torch.Tensor:
        """This rank's partial spectrum ``(*batch, K1, ..., Kd)`` (complex): the retained modes of its
        block alone, before the sum over ranks. No communication."""
        x_local = self._check(x_local, "forward input", self.local_shape, complex_input=not self.real)
        batch = x_local.shape[: x_local.dim() - len(self.global_shape)]
        flat = x_local.reshape(math.prod(batch), *self.local_shape)
        spec = self._run(self._forward_stages, flat, "forward", self._forward_adjoint)
        return spec.view(*batch, *self.mode_shape)

    def forward(self, x: torch.Tensor, sharded: bool = False) -> torch.Tensor:
        """Retained modes of the global field (zero padded as ``padding`` says).

        Args:
            x: this rank's block ``(*batch, n1_loc, ..., nd_loc)`` (real for a real plan, complex
                otherwise), or a DTensor of the global field ``(*batch, N1, ..., Nd)``.
            sharded: False: ``(*batch, K1, ..., Kd)`` complex, the same on every rank (an all-reduce;
                a DTensor input gives a Replicate DTensor). True: ``(*batch, *share_shape)``, this
                rank's chunk ``share_slice()`` of the first mode dim (a reduce-scatter per spatial mesh
                dim: half the bytes of an all-reduce; a DTensor input gives one sharded on that dim).
        """
        if isinstance(x, DTensor):
            return self._forward_dtensor(x, sharded)
        if not sharded:
            return self.layout.all_reduce(self.partial_spectrum(x))
        x = self._check(x, "forward input", self.local_shape, complex_input=not self.real)
        batch = x.shape[: x.dim() - len(self.global_shape)]
        flat = x.reshape(math.prod(batch), *self.local_shape)
        share = self._scatter(self._forward_stages, self._forward_adjoint, "forward", flat)
        return share.view(*batch, *share.shape[1:])

    def inverse(self, xhat: torch.Tensor, sharded: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's block of the inverse transform of the zero-filled spectrum (over the padded
        extents, at the real points).

        Args:
            xhat: ``sharded=False``: ``(*batch, K1, ..., Kd)`` complex, the same on every rank (no
                communication). ``sharded=True``: ``(*batch, *share_shape)`` shares as
                ``forward(x, sharded=True)`` returns them, all-gathered first. Or a DTensor of the
                spectrum (Replicate, or sharded on the first mode dim as ``forward`` returns it).
            out: a preallocated contiguous tensor of the result's shape and dtype to write it into (a
                plain ``xhat``, outside autograd), e.g. a resident buffer that spares a fresh allocation.
        Returns ``(*batch, n1_loc, ..., nd_loc)``: real (``irfftn`` semantics) for a real plan, else
        complex; a DTensor of the global field for a DTensor input. A replicated plain ``xhat`` gets
        this rank's contribution as its gradient: the full gradient is the sum over ranks (which the
        all-reduce of a preceding ``forward`` performs).
        """
        if isinstance(xhat, DTensor):
            if out is not None:
                raise PlanError("inverse: out= takes this rank's block, not a DTensor input")
            return self._inverse_dtensor(xhat, sharded)
        what, shape = ("sharded inverse input", self.share_shape) if sharded else ("inverse input", self.mode_shape)
        xhat = self._check(xhat, what, shape, complex_input=True)
        batch = xhat.shape[: xhat.dim() - len(self.mode_shape)]
        if out is not None:
            self._check_out(out, (*batch, *self.local_shape), xhat)
        spec = xhat.reshape(math.prod(batch), *shape)
        if sharded:
            y = self._gather(self._inverse_stages, self._inverse_adjoint, "inverse", spec, out)
            return out if out is not None else y.view(*batch, *self.local_shape)
        if out is not None:
            self._run_chunks(self._inverse_stages, spec, "inverse", out)
            return out
        return self._run(self._inverse_stages, spec, "inverse", self._inverse_adjoint).view(*batch, *self.local_shape)

    def use_workspace(self, work: Workspace) -> None:
        """Take the scratch buffers of every pass from ``work`` from now on, shared with plans that never run
        at once (an FNO's blocks: ``drift.nn.executor.Executor``), instead of the plan's own."""
        self._workspace = work

    def inverse_slab(self, spectrum: torch.Tensor, points: slice, out: torch.Tensor | None = None) -> torch.Tensor:
        """The points ``points`` (a step-1 slice) of the first dim of this rank's block of the inverse of
        ``spectrum`` ``(rows, K1, ..., Kd)``, the whole retained spectrum on every rank (complex, outside
        autograd; no communication): a slab of the block whose every field is one run of memory. Its
        stages contract dim 0 first (``_contraction.slab_order``; built on first use), with dim 0's basis
        cut to the slab, so every intermediate has the slab's size and the slabs of a block cost one
        inverse's FLOPs. Returns ``(rows, len(points), *local_shape[1:])``, fresh or written into ``out``
        (contiguous, that shape)."""
        if self._slab_stages is None:
            self._slab_stages = self._build_slab_stages()
        first = self._slab_stages[0]
        matrix = getattr(self, first.name)
        matrix = matrix[:, points] if first.right else matrix[points]
        stages = (replace(first, out=matrix.shape[1] if first.right else matrix.shape[0]), *self._slab_stages[1:])
        matrices = [matrix, *(getattr(self, stage.name) for stage in stages[1:])]
        return self._run_chunks(stages, spectrum, "inverse_slab", out, matrices)

    @property
    def has_constant_mode(self) -> bool:
        """Whether the kept modes hold frequency 0 on every dim: the one mode whose inverse is constant."""
        return all(0 in m for m in self.modes)

    def add_constant_(self, xhat: torch.Tensor, value: torch.Tensor, sharded: bool = False) -> torch.Tensor:
        """``xhat`` (``(b, c, K1, ..., Kd)``, or this rank's share of it when ``sharded``; complex, outside
        autograd) with ``value`` ``(c,)`` added so that its inverse gains ``value[j]`` at every point of
        channel j: the constant mode's coefficient, ``value`` over the inverse's scale (only the rank whose
        share holds it changes anything). PlanError where the kept modes lack frequency 0 on some dim."""
        if not self.has_constant_mode:
            raise PlanError(f"add_constant_: the kept modes {self.mode_shape} lack frequency 0 on some dim")
        position = [m.index(0) for m in self.modes]
        if sharded:
            share = self.share_slice()
            if not share.start <= position[0] < share.stop:
                return xhat
            position[0] -= share.start
        scale = math.prod([self._scale(dim, inverse=True) for dim in range(len(self.modes))])
        xhat[(slice(None), slice(None), *position)] += value.to(xhat.dtype) / scale
        return xhat

    def _check_out(self, out: torch.Tensor, shape: tuple[int, ...], xhat: torch.Tensor) -> None:
        """PlanError unless ``out`` can take the inverse of ``xhat`` as it is: contiguous, of ``shape``,
        the result's dtype and device, apart from ``xhat``'s memory, and not recorded by autograd (checked
        before any collective)."""
        dtype = self.dtype if self.real else self.complex_dtype
        if tuple(out.shape) != shape or out.dtype != dtype or out.device != self.device or not out.is_contiguous():
            raise PlanError(
                f"inverse: out= must be a contiguous {dtype} tensor of shape {shape} on {self.device}, got "
                f"{'a contiguous' if out.is_contiguous() else 'a non-contiguous'} {out.dtype} tensor of shape "
                f"{tuple(out.shape)} on {out.device}"
            )
        # Storages are not traced by torch.compile, which writes out= through a copy anyway.
        shared = not torch.compiler.is_compiling() and out.numel() and xhat.numel()
        if shared and out.untyped_storage().data_ptr() == xhat.untyped_storage().data_ptr():
            raise PlanError("inverse: out= shares memory with the input; give a separate tensor")
        if recorded(xhat, out):
            raise PlanError("inverse: out= does not support automatic differentiation (an input requires grad)")

    def _dtensor_lead(self, x: DTensor, what: str) -> int:
        layout, _ = dtensor_layout(x, len(self.global_shape), batch_axes_ok=False)
        if layout != self.layout:
            raise PlanError(f"{what}: a DTensor laid out as {layout} does not match the plan's {self.layout}")
        return x.dim() - len(self.global_shape)

    def _forward_dtensor(self, x: DTensor, sharded: bool) -> DTensor:
        lead = self._dtensor_lead(x, "forward input")
        shape = (*x.shape[:lead], *self.mode_shape)
        if sharded:
            share = self.forward(x.to_local(), sharded=True)
            return to_dtensor(share, x.device_mesh, self.layout.share_placements(lead), shape)
        # DTensor's convention: a Replicate result's gradient is already whole on every rank.
        spec = self.layout.all_reduce(self.partial_spectrum(x.to_local()), replicated_grad=True)
        return to_dtensor(spec, x.device_mesh, (Replicate(),) * x.device_mesh.ndim, shape)

    def _inverse_dtensor(self, xhat: DTensor, sharded: bool) -> DTensor:
        lead = xhat.dim() - len(self.mode_shape)
        if xhat.device_mesh != self.layout.mesh or tuple(xhat.shape[lead:]) != self.mode_shape:
            raise PlanError(
                f"inverse input: a DTensor of shape {tuple(xhat.shape)} on {xhat.device_mesh} does not match the "
                f"plan's modes {self.mode_shape} on {self.layout.mesh}"
            )
        expected = self.layout.share_placements(lead) if sharded else (Replicate(),) * xhat.device_mesh.ndim
        if tuple(xhat.placements) != expected:
            raise PlanError(f"inverse input: placements {xhat.placements}, expected {expected} (sharded={sharded})")
        local = xhat.to_local()
        if not sharded:
            local = self.layout.replicate(local)
        y = self.inverse(local, sharded=sharded)
        shape = (*xhat.shape[:lead], *self.global_shape)
        return to_dtensor(y, xhat.device_mesh, shift_placements(self.layout.placements, lead), shape)
