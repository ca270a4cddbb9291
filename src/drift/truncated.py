"""The Distributed Truncated Spectral Transform (DTST): only the retained Fourier modes of a sharded field.

Rank p holds the block x_p of a global field x (``N1 x ... x Nd``) at offsets ``o``. Its partial
spectrum at the retained frequencies ``S = S1 x ... x Sd`` is one matrix product per dim,

    X_p = B_1 ... B_d x_p,    B_i[k, j] = exp(-2 pi i S_i[k] (o_i + j) / N_i),

and the spectrum is the sum of the partial spectra over ranks: one all-reduce (or a reduce-scatter
when every rank keeps only its share of the modes) whose payload is the number of retained modes,
whatever the grid extents. The inverse applies the adjoint bases to the retained spectrum and needs
no communication once every rank holds it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from drift import comm
from drift._plan import Workspace, check_input, complex_dtype, resolve_device
from drift.decomposition import block_slice, check_grid, local_slices

_NORMS = ("backward", "ortho", "forward")
WORK_BYTES = 64 * 2**20  # the bound on a chunk's intermediates in passes autograd does not record
ModeSpec = int | Sequence[int]


def mode_indices(spec: ModeSpec, n: int, dim: int, half: bool) -> tuple[int, ...]:
    """The retained frequency indices on one dim of extent ``n``.

    An int k keeps {0..k-1} then {n-k..n-1} (Li et al.'s FNO convention), or 0..k-1 on the half
    spectrum (``half``: the last dim of a real transform). A sequence lists indices in the order to
    keep them; a negative index i means n + i.
    """
    limit = n // 2 + 1 if half else n
    if isinstance(spec, bool) or not isinstance(spec, int | Sequence):
        raise ValueError(f"modes on dim {dim} must be an int or a sequence of ints, got {spec!r}")
    if isinstance(spec, int):
        if spec < 1:
            raise ValueError(f"modes on dim {dim}: k = {spec} must be at least 1")
        if half:
            if spec > limit:
                raise ValueError(
                    f"modes on dim {dim}: k = {spec} exceeds the {limit} frequencies of the half spectrum of extent {n}"
                )
            return tuple(range(spec))
        if 2 * spec > n:
            raise ValueError(f"modes on dim {dim}: 2k = {2 * spec} exceeds the extent {n}")
        return tuple(range(spec)) + tuple(range(n - spec, n))
    if len(spec) == 0:
        raise ValueError(f"modes on dim {dim}: the index list is empty")
    out = []
    for i in spec:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"modes on dim {dim}: index {i!r} is not an int")
        if not -n <= i < n:
            raise ValueError(f"modes on dim {dim}: index {i} is out of range for extent {n}")
        f = i + n if i < 0 else i
        if f >= limit:
            raise ValueError(
                f"modes on dim {dim}: index {i} is beyond the half spectrum (0..{limit - 1}) of extent {n}"
            )
        out.append(f)
    if len(set(out)) != len(out):
        raise ValueError(f"modes on dim {dim}: duplicate indices in {list(spec)}")
    return tuple(out)


def mode_lists(modes: ModeSpec | Sequence[ModeSpec], global_shape: tuple[int, ...], real: bool) -> tuple:
    """Per-dim kept indices (``mode_indices``) for ``modes`` given per dim, or as one int for all dims."""
    d = len(global_shape)
    if isinstance(modes, int):
        modes = (modes,) * d
    if len(modes) != d:
        raise ValueError(f"modes needs one entry per dim of global_shape {global_shape}, got {len(modes)}")
    return tuple(
        mode_indices(spec, n, i, real and i == d - 1)
        for i, (spec, n) in enumerate(zip(modes, global_shape, strict=True))
    )


def _stage_flops(rest: int, n: int, k: int, real: bool) -> int:
    """FLOPs of mapping one dim from n to k entries over ``rest`` lines: a real gemm producing 2k
    outputs (real and imaginary parts) or a complex gemm (8 real FLOPs per multiply-add)."""
    return (4 if real else 8) * rest * n * k


def contraction_flops(order: Sequence[int], local: Sequence[int], kept: Sequence[int], real: bool) -> int:
    """Forward FLOPs of one field when the dims are contracted in ``order`` (the first stage is a real
    gemm when ``real``)."""
    sizes = list(local)
    total = 0
    for step, dim in enumerate(order):
        rest = math.prod(sizes) // sizes[dim]
        total += _stage_flops(rest, sizes[dim], kept[dim], real and step == 0)
        sizes[dim] = kept[dim]
    return total


def best_order(local: Sequence[int], kept: Sequence[int], real: bool) -> tuple[tuple[int, ...], int]:
    """The contraction order with the fewest forward FLOPs, and that count (ties: lexicographic)."""
    return min(
        ((order, contraction_flops(order, local, kept, real)) for order in itertools.permutations(range(len(local)))),
        key=lambda item: (item[1], item[0]),
    )


@dataclass(frozen=True)
class _Stage:
    """One per-dim gemm. ``right``: the dim is innermost in memory and the tensor is viewed (A, n) and
    multiplied on the right; otherwise it is viewed (A, n, B) and the matrix multiplies on the left.
    ``kind``: "complex", "real_in" (real input, complex output) or "real_out" (complex input, real
    output, the real part only)."""

    dim: int
    matrix: torch.Tensor
    right: bool
    kind: str
    out: int


def _apply(
    t: torch.Tensor, stage: _Stage, work: Workspace | None, key: tuple, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One stage on ``t`` (``(b, s1, ..., sd)``); intermediates go to ``work`` when it is given, and
    the result into ``out`` when that is given (a contiguous tensor of the result's shape)."""

    def buffer(role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        return None if work is None else work.get((*key, role), shape, dtype)

    shape = t.shape
    pos = stage.dim + 1
    lead, n, rest = math.prod(shape[:pos]), shape[pos], math.prod(shape[pos + 1 :])
    new_shape = (*shape[:pos], stage.out, *shape[pos + 1 :])
    if stage.kind == "real_out":
        if stage.right:
            t = torch.view_as_real(t).reshape(lead, 2 * n)
        else:
            t = t.reshape(lead, n, rest)
            parts = buffer("parts", (lead, 2 * n, rest), stage.matrix.dtype)
            t = torch.cat((t.real, t.imag), dim=1, out=parts)
    elif stage.right:
        t = t.reshape(lead, n)
    else:
        t = t.reshape(lead, n, rest)
    rows = 2 * stage.out if stage.kind == "real_in" else stage.out
    gemm_shape = (lead, rows) if stage.right else (lead, rows, rest)
    if out is not None and stage.kind != "real_in":
        target = out.view(gemm_shape)
    else:
        target = buffer("gemm", gemm_shape, t.dtype)
    result = torch.matmul(t, stage.matrix, out=target) if stage.right else torch.matmul(stage.matrix, t, out=target)
    if stage.kind == "real_in":
        k = stage.out
        if stage.right:
            result = torch.view_as_complex(result.view(lead, k, 2))
        else:
            cplx = complex_dtype(result.dtype)
            result = torch.complex(result[:, :k], result[:, k:], out=buffer("complex", (lead, k, rest), cplx))
        if out is not None:
            return out.copy_(result.view(new_shape))
    return result.view(new_shape)


class TruncatedFFT:
    """A resident plan for the retained Fourier modes of a field sharded over a process grid.

    Args:
        global_shape: extents ``(N1, ..., Nd)`` of the transformed (last d) dims.
        modes: per dim an int k or an explicit sequence of frequency indices (see ``mode_indices``);
            a bare int applies to every dim.
        grid: ranks per dim, ``(P1, ..., Pd)``, product the group size; blocks as ``local_slices``.
        real: real input and ``rfftn`` semantics (half spectrum on the last dim), else complex ``fftn``.
        dtype: the real precision, ``torch.float32`` or ``torch.float64``. A real plan takes real input
            of that dtype, a complex plan complex input of the matching complex dtype.
        device: where the bases live and where inputs must be.
        group: the process group (default: the default group, or one rank without one).
        norm: "backward", "ortho" or "forward", as in ``torch.fft``.
        strict: if False, inputs of another floating dtype or device are converted to the plan's;
            a wrong local shape is an error either way.

    Attributes: ``modes`` (kept indices per dim), ``mode_shape`` ``(K1, ..., Kd)``, ``num_modes`` M,
    ``local_shape``, ``local_slices``, ``order`` (dims in contraction order, FLOP-optimal),
    ``flops`` (real FLOPs of the local forward for one field; the inverse costs the same).
    """

    def __init__(
        self,
        global_shape: Sequence[int],
        modes: ModeSpec | Sequence[ModeSpec],
        grid: Sequence[int],
        *,
        real: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        group=None,
        norm: str = "backward",
        strict: bool = True,
    ) -> None:
        self.complex_dtype = complex_dtype(dtype)
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
        self.global_shape = tuple(int(n) for n in global_shape)
        d = len(self.global_shape)
        if d == 0:
            raise ValueError("global_shape must have at least one dim")
        self.group = group
        self.world_size = comm.world_size(group)
        self.rank = comm.rank(group)
        self.grid = check_grid(self.global_shape, grid, self.world_size)
        self.modes = mode_lists(modes, self.global_shape, real)
        self.real = real
        self.dtype = dtype
        self.device = resolve_device(device)
        self.norm = norm
        self.strict = strict
        self.mode_shape = tuple(len(m) for m in self.modes)
        self.num_modes = math.prod(self.mode_shape)
        self.local_slices = local_slices(self.global_shape, self.grid, self.rank)
        self.local_shape = tuple(s.stop - s.start for s in self.local_slices)
        self.order, self.flops = best_order(self.local_shape, self.mode_shape, real)
        self._forward_stages = self._build_forward()
        self._inverse_stages = self._build_inverse()
        self._workspace = Workspace(self.device)
        self.work_bytes = WORK_BYTES

    def __repr__(self) -> str:
        return (
            f"TruncatedFFT(global_shape={self.global_shape}, mode_shape={self.mode_shape}, grid={self.grid}, "
            f"rank={self.rank}, real={self.real}, dtype={self.dtype}, norm={self.norm!r}, order={self.order})"
        )

    def _basis(self, dim: int) -> torch.Tensor:
        """B_dim[k, j] = exp(-2 pi i f_k (o + j) / N) in float64, phases reduced exactly mod N."""
        n_global = self.global_shape[dim]
        f = torch.tensor(self.modes[dim], dtype=torch.int64)
        j = torch.arange(self.local_slices[dim].start, self.local_slices[dim].stop, dtype=torch.int64)
        phase = (f[:, None] * j[None, :]) % n_global
        angle = phase.to(torch.float64) * (-2 * math.pi / n_global)
        return torch.polar(torch.ones_like(angle), angle)

    def _scale(self, dim: int, inverse: bool) -> float:
        n = self.global_shape[dim]
        if self.norm == "ortho":
            return 1 / math.sqrt(n)
        return 1 / n if (self.norm == "forward") != inverse else 1.0

    def _is_innermost(self, dim: int, sizes: Sequence[int]) -> bool:
        return math.prod(sizes[dim + 1 :]) == 1

    def _build_forward(self) -> tuple[_Stage, ...]:
        stages = []
        sizes = list(self.local_shape)
        for step, dim in enumerate(self.order):
            b = self._basis(dim) * self._scale(dim, inverse=False)
            right = self._is_innermost(dim, sizes)
            k = self.mode_shape[dim]
            if self.real and step == 0:
                kind = "real_in"
                # right: (n, 2k) with real and imaginary columns interleaved; left: (2k, n) stacked.
                m = torch.view_as_real(b.T.contiguous()).reshape(-1, 2 * k) if right else torch.cat((b.real, b.imag))
                m = m.to(self.dtype)
            else:
                kind = "complex"
                m = (b.T if right else b).to(self.complex_dtype)
            stages.append(_Stage(dim, m.contiguous().to(self.device), right, kind, k))
            sizes[dim] = k
        return tuple(stages)

    def _build_inverse(self) -> tuple[_Stage, ...]:
        stages = []
        sizes = list(self.mode_shape)
        d = len(self.global_shape)
        for step, dim in enumerate(reversed(self.order)):
            e = self._basis(dim).conj().T * self._scale(dim, inverse=True)  # (n, k)
            if self.real and dim == d - 1:
                e = e * self._half_spectrum_weights()
            right = self._is_innermost(dim, sizes)
            n = self.local_shape[dim]
            if self.real and step == d - 1:
                kind = "real_out"
                # Re(e @ z) = e.real @ z.real - e.imag @ z.imag, as one real gemm.
                m = (
                    torch.stack((e.real.T, -e.imag.T), dim=1).reshape(-1, n)
                    if right
                    else torch.cat((e.real, -e.imag), dim=1)
                )
                m = m.to(self.dtype)
            else:
                kind = "complex"
                m = (e.T if right else e).to(self.complex_dtype)
            stages.append(_Stage(dim, m.contiguous().to(self.device), right, kind, n))
            sizes[dim] = n
        return tuple(stages)

    def _half_spectrum_weights(self) -> torch.Tensor:
        """irfft's weights on the last dim: 1 for DC and an even extent's Nyquist, 2 for the others."""
        n = self.global_shape[-1]
        return torch.tensor([1.0 if f == 0 or 2 * f == n else 2.0 for f in self.modes[-1]], dtype=torch.float64)

    def mode_slice(self, rank: int) -> slice:
        """The slice of the row-major flattened retained modes that ``rank`` holds when sharded."""
        return block_slice(self.num_modes, self.world_size, rank)

    def _check(self, t: torch.Tensor, what: str, shape: tuple[int, ...], complex_input: bool) -> torch.Tensor:
        dtype = self.complex_dtype if complex_input else self.dtype
        return check_input(t, what, self.rank, shape, dtype, self.device, self.strict)

    def _run(self, stages: tuple[_Stage, ...], t: torch.Tensor, name: str) -> torch.Tensor:
        """Apply ``stages`` in turn to ``t`` (``(rows, ...)``).

        A pass autograd records allocates its intermediates. Any other pass runs in chunks of rows
        whose intermediates fit ``work_bytes``, staged through the plan's resident workspace, and the
        last stage writes each chunk straight into the (fresh) result.
        """
        if torch.is_grad_enabled() and t.requires_grad:
            for stage in stages:
                t = _apply(t, stage, None, ())
            return t
        sizes, rows = list(t.shape[1:]), t.shape[0]
        widest = math.prod(sizes)
        for stage in stages:
            sizes[stage.dim] = stage.out
            widest = max(widest, math.prod(sizes))
        chunk = max(1, min(rows, self.work_bytes // (4 * widest * self.complex_dtype.itemsize)))
        result_dtype = self.dtype if stages[-1].kind == "real_out" else self.complex_dtype
        result = t.new_empty((rows, *sizes), dtype=result_dtype)
        for start in range(0, rows, chunk):
            piece = t[start : start + chunk]
            for i, stage in enumerate(stages[:-1]):
                piece = _apply(piece, stage, self._workspace, (name, i))
            _apply(piece, stages[-1], None, (), out=result[start : start + chunk])
        return result

    def forward(self, x_local: torch.Tensor, out: str = "replicated") -> torch.Tensor:
        """Retained modes of the global field from this rank's block.

        Args:
            x_local: ``(*batch, n1_loc, ..., nd_loc)``, real for a real plan, complex otherwise.
            out: "replicated": ``(*batch, K1, ..., Kd)`` complex, the same on every rank (all-reduce).
                "sharded": ``(*batch, M_p)``, this rank's share ``mode_slice(rank)`` of the row-major
                flattened modes (reduce-scatter: half the bytes of an all-reduce).
        """
        if out not in ("replicated", "sharded"):
            raise ValueError(f"out must be 'replicated' or 'sharded', got {out!r}")
        x_local = self._check(x_local, "forward input", self.local_shape, complex_input=not self.real)
        d = len(self.global_shape)
        batch = x_local.shape[: x_local.dim() - d]
        spec = self._run(self._forward_stages, x_local.reshape(-1, *self.local_shape), "forward")
        if out == "replicated":
            return comm.all_reduce(spec, group=self.group).view(*batch, *self.mode_shape)
        shares = comm.reduce_scatter(self._pad_shares(spec.reshape(-1, self.num_modes)), group=self.group)
        mine = self._share_size(self.rank)
        return shares[:, :mine].reshape(*batch, mine)

    def inverse(self, xhat: torch.Tensor, inp: str = "replicated") -> torch.Tensor:
        """This rank's block of the inverse transform of the zero-filled spectrum.

        Args:
            xhat: "replicated": ``(*batch, K1, ..., Kd)`` complex, the same on every rank (no
                communication). "sharded": ``(*batch, M_p)`` shares as ``forward(out="sharded")``
                returns them, all-gathered first.
        Returns ``(*batch, n1_loc, ..., nd_loc)``: real (``irfftn`` semantics) for a real plan, else complex.
        A replicated ``xhat`` gets this rank's contribution as its gradient: the full gradient is the
        sum over ranks (which the all-reduce of a preceding ``forward`` performs).
        """
        if inp == "replicated":
            xhat = self._check(xhat, "inverse input", self.mode_shape, complex_input=True)
            batch = xhat.shape[: xhat.dim() - len(self.mode_shape)]
            spec = xhat.reshape(-1, *self.mode_shape)
        elif inp == "sharded":
            mine = self._share_size(self.rank)
            xhat = self._check(xhat, "sharded inverse input", (mine,), complex_input=True)
            batch = xhat.shape[:-1]
            padded = self._pad_share(xhat.reshape(math.prod(batch), mine))
            spec = self._unpad_shares(comm.all_gather(padded, group=self.group)).view(-1, *self.mode_shape)
        else:
            raise ValueError(f"inp must be 'replicated' or 'sharded', got {inp!r}")
        return self._run(self._inverse_stages, spec, "inverse").view(*batch, *self.local_shape)

    __call__ = forward

    def _share_size(self, rank: int) -> int:
        s = self.mode_slice(rank)
        return s.stop - s.start

    @property
    def _padded_share(self) -> int:
        return -(-self.num_modes // self.world_size)

    def _pad_shares(self, spec: torch.Tensor) -> torch.Tensor:
        """(b, M) -> (P * b, c): rank q's share in rows [q b, (q + 1) b), zero-padded to c columns."""
        b = spec.shape[0]
        send = spec.new_zeros(self.world_size, b, self._padded_share)
        for q in range(self.world_size):
            s = self.mode_slice(q)
            send[q, :, : s.stop - s.start] = spec[:, s]
        return send.view(self.world_size * b, -1)

    def _pad_share(self, share: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(share, (0, self._padded_share - share.shape[-1]))

    def _unpad_shares(self, gathered: torch.Tensor) -> torch.Tensor:
        """(P * b, c) -> (b, M), the inverse of ``_pad_shares``."""
        blocks = gathered.view(self.world_size, -1, self._padded_share)
        return torch.cat([blocks[q, :, : self._share_size(q)] for q in range(self.world_size)], dim=1)
