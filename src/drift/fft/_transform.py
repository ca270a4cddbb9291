"""Distributed full transforms: FFT (complex and real) and DCT-II over slab and pencil grids.

The plan transforms every dim that is whole on this rank with one local call, then, while a dim is
still untransformed, swaps it with a whole, transformed dim by an all-to-all inside the group of the
mesh dim that splits it (the ranks that differ only in that mesh coordinate), and transforms it. A
slab (one mesh dim splitting one field dim) takes one transpose, a pencil (two mesh dims) two. The
output is left where the last transpose put it: ``output_slices()`` says which block a rank holds and
``output_placements`` says it as DTensor placements. The inverse runs the steps backwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from drift import comm
from drift._plan import ComplexModule, Workspace, check_input, complex_dtype, real_dtype, resolve_device
from drift.errors import PlanError
from drift.fft import _dct as dct
from drift.layout import Layout, chunk_sizes, chunk_slice, dtensor_layout, shift_placements, to_dtensor
from drift.modes import ModeSpec, mode_lists
from drift.recording import recorded

KINDS = ("c2c", "r2c", "dct2")
STAGING_BYTES = 64 * 2**20  # the in-place mode's bound on any temporary buffer


@dataclass(frozen=True)
class _Local:
    """Transform ``dims`` locally (they are whole on every rank at this step)."""

    dims: tuple[int, ...]
    sizes: tuple[int, ...]  # their input extents (for the inverse real transform)


@dataclass(frozen=True)
class _Transpose:
    """Make dim ``gather`` whole and split dim ``scatter`` over the same mesh dim.

    ``gather_sizes[q]`` and ``scatter_sizes[q]`` are rank q's block extents (in the mesh dim's group,
    which ``coord`` indexes) on the two dims; before the step this rank holds block ``coord`` of
    ``gather``.
    """

    gather: int
    scatter: int
    gather_sizes: tuple[int, ...]
    scatter_sizes: tuple[int, ...]
    coord: int
    group: object

    def reversed(self) -> _Transpose:
        return _Transpose(self.scatter, self.gather, self.scatter_sizes, self.gather_sizes, self.coord, self.group)


def _even(step: _Transpose) -> bool:
    return len(set(step.gather_sizes)) == 1 and len(set(step.scatter_sizes)) == 1


def _exchange(t: torch.Tensor, step: _Transpose, work: Workspace | None, key: tuple) -> torch.Tensor:
    """One transpose of a ``(b, ...)`` block: pack per destination, all-to-all, unpack.

    Packing is free when the scattered dim is the outermost non-trivial one (its pieces are already
    contiguous), unpacking when the gathered dim is; intermediates go to ``work`` when it is given.
    """
    gather, scatter = step.gather + 1, step.scatter + 1
    me = step.coord
    pieces = t.split(list(step.scatter_sizes), dim=scatter)
    send_counts = [p.numel() for p in pieces]
    if math.prod(t.shape[:scatter]) == 1:
        send = t.reshape(-1)
    else:
        send = t.new_empty(t.numel()) if work is None else work.get((*key, "send"), (t.numel(),), t.dtype, t.device)
        start = 0
        for piece in pieces:  # narrow, not split: autograd allows in-place writes into single views
            send.narrow(0, start, piece.numel()).view(piece.shape).copy_(piece)
            start += piece.numel()
    shapes = []
    for size in step.gather_sizes:
        shape = list(t.shape)
        shape[gather], shape[scatter] = size, step.scatter_sizes[me]
        shapes.append(shape)
    recv_counts = [math.prod(s) for s in shapes]
    total = sum(recv_counts)
    out_shape = list(shapes[0])
    out_shape[gather] = sum(step.gather_sizes)
    if work is None:
        recv = comm.all_to_all(send, send_counts, recv_counts, group=step.group)
    else:
        buf = work.get((*key, "recv"), (total,), t.dtype, t.device)
        recv = comm.all_to_all(send, send_counts, recv_counts, group=step.group, out=buf)
    if math.prod(out_shape[:gather]) == 1:
        return recv.view(out_shape)
    blocks = [p.view(s) for p, s in zip(recv.split(recv_counts), shapes, strict=True)]
    if work is None:
        return torch.cat(blocks, dim=gather)
    return torch.cat(blocks, dim=gather, out=work.get((*key, "out"), tuple(out_shape), t.dtype, t.device))


def _pairing(rank: int, size: int) -> list[int | None]:
    """``rank``'s partner in each round of a round-robin tournament over ``size`` ranks: every pair
    meets exactly once, each rank meets at most one partner per round (None: idle, for odd sizes)."""
    n = size + size % 2
    partners: list[int | None] = []
    for r in range(n - 1):
        # Seat n - 1 stays and meets seat r; the others pair up mirrored around r.
        partner = r + n - 1 - rank if rank in (r, n - 1) else (2 * r - rank) % (n - 1)
        partners.append(partner if partner < size else None)
    return partners


def _transpose_blocks(flat: torch.Tensor, rows: int, cols: int) -> None:
    """In place: ``flat`` viewed ``(rows, cols, e)`` becomes ``(cols, rows, e)``.

    Follows the cycles of the permutation with one element (``e`` values) of staging.
    """
    if rows == 1 or cols == 1:
        return
    n = rows * cols
    blocks = flat.view(n, -1)
    staging = blocks.new_empty(blocks.shape[1])
    moved = numpy.zeros(n, dtype=bool)
    for start in range(1, n - 1):
        if moved[start]:
            continue
        staging.copy_(blocks[start])
        pos = start
        while True:
            moved[pos] = True
            src = (pos % rows) * cols + pos // rows  # the element that belongs at pos
            if src == start:
                blocks[pos].copy_(staging)
                break
            blocks[pos].copy_(blocks[src])
            pos = src


def _exchange_inplace(t: torch.Tensor, step: _Transpose, staging: int) -> torch.Tensor:
    """The transpose of ``_exchange`` in the storage of the contiguous block ``t`` (equal splits).

    Blocks are reordered by destination in place, swapped pairwise with each peer through at most
    ``staging`` elements of buffer, and reordered into the output layout in place.
    """
    gather, scatter = step.gather + 1, step.scatter + 1
    parts = len(step.gather_sizes)
    shape = list(t.shape)
    flat = t.view(-1)
    lo, hi = min(gather, scatter), max(gather, scatter)
    lead, mid = math.prod(shape[:lo]), math.prod(shape[lo + 1 : hi])
    if gather < scatter:  # (L, n_g, M, P, n_s, R) -> (P, L, n_g, M, n_s, R)
        _transpose_blocks(flat, lead * shape[gather] * mid, parts)
    else:  # (L, P, n_s, M, n_g, R) -> (P, L, n_s, M, n_g, R)
        _transpose_blocks(flat, lead, parts)
    slots = flat.view(parts, -1)
    buffer = flat.new_empty(min(staging, slots.shape[1]))
    for peer in _pairing(step.coord, parts):
        if peer is None:
            continue
        for start in range(0, slots.shape[1], buffer.numel()):
            chunk = slots[peer, start : start + buffer.numel()]
            comm.sendrecv(chunk, buffer[: chunk.numel()], peer, group=step.group)
            chunk.copy_(buffer[: chunk.numel()])
    if gather < scatter:  # (P, L, n_g M n_s R) -> (L, P, n_g, M, n_s, R)
        _transpose_blocks(flat, parts, lead)
    else:  # (P, L n_s M, n_g R) -> (L, n_s, M, P, n_g, R)
        _transpose_blocks(flat, parts, lead * step.scatter_sizes[0] * mid)
    shape[gather], shape[scatter] = sum(step.gather_sizes), step.scatter_sizes[step.coord]
    return flat.view(shape)


def _fft_inplace(t: torch.Tensor, dims: tuple[int, ...], inverse: bool, norm: str, staging: int) -> None:
    """c2c transforms of ``dims`` of ``t`` in place, one dim at a time, in chunks of at most
    ``staging`` elements along another dim (a single slice when no other dim can be chunked)."""
    fft = torch.fft.ifft if inverse else torch.fft.fft
    for dim in dims:
        others = [a for a in range(t.dim()) if a != dim and t.shape[a] > 1]
        if not others:
            t.copy_(fft(t, dim=dim, norm=norm))
            continue
        along = others[0]
        per = t.numel() // t.shape[along]
        width = max(1, staging // per)
        for start in range(0, t.shape[along], width):
            chunk = t.narrow(along, start, min(width, t.shape[along] - start))
            chunk.copy_(fft(chunk, dim=dim, norm=norm))


def _split_axes(layout: Layout) -> tuple[int | None, ...]:
    """The mesh dim splitting each transformed dim; a dim over a mesh dim of one rank is whole (None).
    ValueError when every dim is split: the transposes need a whole dim."""
    if all(p > 1 for p in layout.parts):
        raise ValueError(f"placements {layout.placements} split every dim: at least one dim must be whole")
    return tuple(a if a is not None and layout.axis_size(a) > 1 else None for a in layout.axes)


def _order(axis: list, axis_size, output_shape: Sequence[int], r2c: bool):
    """The schedule's events in turn, updating ``axis`` (the mesh dim splitting each dim) as it goes:
    ``("local", dims)``, a local transform of the whole dims not yet transformed, and ``("swap", split,
    whole, mesh dim)``, a transpose that makes ``split`` whole and splits ``whole`` over that mesh dim.
    Depends only on the split, the ranks per mesh dim and the output extents (the kept modes of a pruned
    plan), not on the resolution."""
    d, transformed = len(axis), set()

    def swap(split: int, candidates):
        a = axis[split]
        # A whole dim is always among the candidates (the whole dims are as many as at the start, and
        # transformed by now). One whose output every rank gets a part of is preferred; a shorter one
        # leaves trailing blocks empty (torch.chunk), which every step handles. Judging by the output
        # extent keeps a pruned plan's output placements the same at every resolution.
        whole_dims = [j for j in candidates if axis[j] is None]
        whole = max([j for j in whole_dims if output_shape[j] >= axis_size(a)] or whole_dims)
        axis[whole], axis[split] = a, None
        return ("swap", split, whole, a)

    if r2c and axis[d - 1] is not None:
        # The real-to-complex transform must come first, on the real last dim: make it whole.
        yield swap(d - 1, range(d - 1))
    while True:
        local = tuple(i for i in range(d) if axis[i] is None and i not in transformed)
        yield ("local", local)
        transformed.update(local)
        pending = [i for i in range(d) if i not in transformed]
        if not pending:
            return
        yield swap(max(pending), transformed)


def _placements(axis: Sequence[int | None], mesh_dims: int) -> tuple:
    return tuple(Shard(axis.index(a)) if a in axis else Replicate() for a in range(mesh_dims))


def pruned_output_placements(mesh, placements: Sequence, mode_shape: Sequence[int], real: bool) -> tuple:
    """Where a pruned ``DistributedFFT`` (``modes`` kept, ``mode_shape`` of them; r2c when ``real``) over
    ``mesh`` with input ``placements`` leaves its output: its ``output_placements`` at any resolution,
    without building it."""
    layout = Layout(mode_shape, mesh, placements)
    axis = list(_split_axes(layout))
    for _ in _order(axis, layout.axis_size, tuple(mode_shape), real):
        pass
    return _placements(axis, len(layout.placements))


class DistributedFFT(ComplexModule):
    """A resident plan for the full distributed transform of the last d dims of sharded blocks.

    Args:
        global_shape: extents ``(N1, ..., Nd)`` of the transformed dims.
        mesh, placements: where the blocks live, as for ``TruncatedFFT`` (``drift.Layout``); at least
            one transformed dim must be whole.
        kind: "c2c" (``torch.fft.fftn``), "r2c" (``torch.fft.rfftn``, last output extent N//2+1) or
            "dct2" (``scipy.fft.dctn(type=2)``; local DCTs by FFT with twiddles, see ``drift.fft._dct``).
        dtype: the real precision, ``torch.float32`` or ``torch.float64``. c2c takes complex input of
            that precision, r2c and dct2 real input. ``.to()``/``.double()``/``.float()`` convert the plan.
        device, strict: as for ``TruncatedFFT``.
        norm: "backward", "ortho" or "forward" ("backward" or "ortho" for dct2).
        inplace: low-memory c2c mode: the output overwrites the input's storage and every temporary
            is bounded by ``plan.staging_bytes``; needs evenly split transposed dims; no autograd.
        modes: a pruned transform (c2c or r2c, out of place): after each local transform only these
            modes are kept (as for ``TruncatedFFT``), so the transposes move only kept data;
            ``output_shape`` is then the mode shape and ``inverse`` zero-fills the dropped modes.

    Input blocks follow ``layout.local_slices``; output blocks follow ``output_slices()`` inside
    ``output_shape``, split as ``output_placements`` say. DTensor inputs give DTensor outputs.

    Example, on one device (on a mesh each rank passes its block and gets its block of the output):

    >>> import torch, drift
    >>> plan = drift.DistributedFFT((16, 12), kind="r2c", dtype=torch.float64)
    >>> plan.output_shape
    (16, 7)
    >>> x = torch.randn(4, 16, 12, dtype=torch.float64)
    >>> torch.allclose(plan.forward(x), torch.fft.rfftn(x, dim=(-2, -1)))
    True
    """

    @torch.inference_mode(False)  # buffers made during an inference pass must serve training later
    def __init__(
        self,
        global_shape: Sequence[int],
        mesh=None,
        placements: Sequence | None = None,
        *,
        kind: str = "c2c",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        norm: str = "backward",
        inplace: bool = False,
        strict: bool = True,
        modes: ModeSpec | Sequence[ModeSpec] | None = None,
    ) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if inplace and kind != "c2c":
            raise ValueError(f"inplace=True transforms c2c in the input's storage; kind {kind!r} is not supported")
        complex_dtype(dtype)
        norms = ("backward", "ortho") if kind == "dct2" else ("backward", "ortho", "forward")
        if norm not in norms:
            raise ValueError(f"norm for kind {kind!r} must be one of {norms}, got {norm!r}")
        self.layout = Layout(global_shape, mesh, placements)
        self.global_shape = self.layout.global_shape
        _split_axes(self.layout)  # ValueError before anything is built when every dim is split
        self.kind, self.norm, self.inplace, self.strict = kind, norm, inplace, strict
        device = resolve_device(device)
        # An empty buffer that carries the plan's precision and device through module conversions.
        self.register_buffer("anchor", torch.empty(0, dtype=dtype, device=device), persistent=False)
        out = list(self.global_shape)
        if kind == "r2c":
            out[-1] = out[-1] // 2 + 1
        self.modes = None
        if modes is not None:
            if kind == "dct2" or inplace:
                raise ValueError("modes (a pruned transform) apply to the out-of-place c2c and r2c kinds")
            self.modes = mode_lists(modes, self.global_shape, kind == "r2c")
            out = [len(m) for m in self.modes]
            for i, m in enumerate(self.modes):
                self.register_buffer(f"keep_{i}", torch.tensor(m, device=device), persistent=False)
        self.output_shape = tuple(out)
        self.local_slices = self.layout.local_slices
        self.local_shape = self.layout.local_shape
        self._steps, self._output_axes = self._schedule()
        self.output_local_shape = tuple(s.stop - s.start for s in self.output_slices())
        self._workspace = Workspace()
        self.staging_bytes = STAGING_BYTES
        if inplace:
            uneven = [st for st in self._steps if isinstance(st, _Transpose) and not _even(st)]
            if uneven:
                raise ValueError(
                    f"inplace=True needs the transposed dims to split evenly over their ranks; "
                    f"dims {uneven[0].gather} and {uneven[0].scatter} of {self.global_shape} do not over "
                    f"{len(uneven[0].gather_sizes)} ranks"
                )

    @property
    def dtype(self) -> torch.dtype:
        """The real precision the plan computes in."""
        return real_dtype(self.anchor.dtype)

    @property
    def complex_dtype(self) -> torch.dtype:
        return complex_dtype(self.dtype)

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def _before_conversion(self) -> None:
        self._workspace.clear()

    def extra_repr(self) -> str:
        return (
            f"global_shape={self.global_shape}, layout={self.layout.placements}, kind={self.kind!r}, "
            f"dtype={self.dtype}, norm={self.norm!r}, inplace={self.inplace}"
        )

    def _schedule(self) -> tuple[list, tuple]:
        """The forward steps, and the mesh dim each output dim is split over (None: whole)."""
        layout = self.layout
        extents = list(self.global_shape)
        steps: list = []
        axis = list(_split_axes(layout))
        for event in _order(axis, layout.axis_size, self.output_shape, self.kind == "r2c"):
            if event[0] == "local":
                local = event[1]
                steps.append(_Local(local, tuple(extents[i] for i in local)))
                for i in local:  # what the local transform leaves: the kept modes, or the half spectrum
                    if self.modes or (self.kind == "r2c" and i == len(extents) - 1):
                        extents[i] = self.output_shape[i]
                continue
            _, split, whole, a = event
            parts = layout.axis_size(a)
            sizes = (tuple(chunk_sizes(extents[split], parts)), tuple(chunk_sizes(extents[whole], parts)))
            steps.append(_Transpose(split, whole, *sizes, layout.coordinate[a], layout.group(a)))
        return steps, tuple(axis)

    def output_slices(self, coordinate: Sequence[int] | None = None) -> tuple[slice, ...]:
        """Global index slices (inside ``output_shape``) of the output block of this rank, or of the rank
        at mesh ``coordinate``."""
        coordinate = self.layout.coordinate if coordinate is None else coordinate
        return tuple(
            slice(0, n) if a is None else chunk_slice(n, self.layout.axis_size(a), coordinate[a])
            for n, a in zip(self.output_shape, self._output_axes, strict=True)
        )

    @property
    def output_placements(self) -> tuple:
        """The output's placements, one per mesh dim, as for a DTensor of shape ``output_shape``."""
        return _placements(self._output_axes, len(self.layout.placements))

    def _check(self, t: torch.Tensor, what: str, shape: tuple[int, ...], complex_input: bool) -> torch.Tensor:
        dtype = self.complex_dtype if complex_input else self.dtype
        return check_input(t, what, comm.rank(), shape, dtype, self.device, self.strict)

    def _transform(self, t: torch.Tensor, step: _Local, first: bool, inverse: bool) -> torch.Tensor:
        dims = tuple(i + 1 for i in step.dims)
        if not dims:
            return t
        if self.modes is None:
            return self._full_transform(t, step, dims, first, inverse)
        if not inverse:
            t = self._full_transform(t, step, dims, first, inverse)
            for i in step.dims:
                t = t.index_select(i + 1, getattr(self, f"keep_{i}"))
            return t
        for i, n in zip(step.dims, step.sizes, strict=True):  # zero-fill the dropped modes
            full = list(t.shape)
            full[i + 1] = n // 2 + 1 if (self.kind == "r2c" and i == len(self.global_shape) - 1) else n
            t = t.new_zeros(full).index_copy(i + 1, getattr(self, f"keep_{i}"), t)
        return self._full_transform(t, step, dims, first, inverse)

    def _full_transform(self, t: torch.Tensor, step: _Local, dims: tuple[int, ...], first: bool, inverse: bool):
        if t.numel() == 0 and t.device.type != "meta":
            # oneMKL rejects empty transforms. An empty block's transform is empty; adding the (empty)
            # input's zero sum keeps it in the autograd graph, so this rank's backward still runs.
            shape = self._full_transform(t.detach().to("meta"), step, dims, first, inverse)
            anchor = t.abs().sum() * 0
            return t.new_zeros(shape.shape, dtype=shape.dtype) + anchor
        if self.kind == "dct2":
            for dim in dims:
                t = (dct.idct2 if inverse else dct.dct2)(t, dim, self.norm)
            return t
        if self.kind == "r2c" and first:
            if inverse:
                return torch.fft.irfftn(t, s=step.sizes, dim=dims, norm=self.norm)
            return torch.fft.rfftn(t, dim=dims, norm=self.norm)
        return (torch.fft.ifftn if inverse else torch.fft.fftn)(t, dim=dims, norm=self.norm)

    def _run(self, t: torch.Tensor, inverse: bool) -> torch.Tensor:
        """The steps in order (backwards for the inverse). Unless autograd records the pass, the
        transposes stage through the plan's resident workspace; the last step returns a fresh tensor."""
        work = None if recorded(t) else self._workspace
        first_local = next(i for i, step in enumerate(self._steps) if isinstance(step, _Local))
        order = range(len(self._steps) - 1, -1, -1) if inverse else range(len(self._steps))
        last = order[-1]
        for i in order:
            step = self._steps[i]
            if isinstance(step, _Local):
                t = self._transform(t, step, i == first_local, inverse)
            else:
                step = step.reversed() if inverse else step
                # Forward and inverse never run at once: step i's buffers serve both directions.
                t = _exchange(t, step, work if i != last else None, ("transpose", i))
        return t

    def _run_inplace(self, t: torch.Tensor, what: str, shape: tuple[int, ...], inverse: bool) -> torch.Tensor:
        """The steps in the storage of ``t``; returns a view of that storage in the output shape."""
        if not t.is_contiguous():
            raise PlanError(f"{what} on rank {comm.rank()}: inplace=True needs a contiguous tensor")
        if recorded(t):
            raise PlanError(f"{what} on rank {comm.rank()}: inplace=True does not record autograd")
        staging = max(1, self.staging_bytes // t.element_size())
        t = t.view(math.prod(t.shape[: t.dim() - len(shape)]), *shape)
        if t.numel() == 0:  # an empty batch on every rank: nothing to transform or exchange
            return t
        steps = reversed(self._steps) if inverse else self._steps
        for step in steps:
            if isinstance(step, _Local):
                _fft_inplace(t, tuple(i + 1 for i in step.dims), inverse, self.norm, staging)
            else:
                t = _exchange_inplace(t, step.reversed() if inverse else step, staging)
        return t

    def _execute(self, t: torch.Tensor, inverse: bool) -> torch.Tensor:
        what = "inverse input" if inverse else "forward input"
        shape, out_shape = (
            (self.output_local_shape, self.local_shape) if inverse else (self.local_shape, self.output_local_shape)
        )
        complex_input = self.kind != "dct2" if inverse else self.kind == "c2c"
        t = self._check(t, what, shape, complex_input)
        batch = t.shape[: t.dim() - len(self.global_shape)]
        out = (
            self._run_inplace(t, what, shape, inverse)
            if self.inplace
            else self._run(t.reshape(math.prod(batch), *shape), inverse)
        )
        return out.reshape(*batch, *out_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's block (``output_slices()``) of the global transform.

        ``x`` is this rank's block ``(*batch, n1_loc, ..., nd_loc)`` as ``local_slices``: complex for
        c2c, real for r2c and dct2; or a DTensor of the global field with the plan's layout, which
        gives a DTensor of shape ``(*batch, *output_shape)`` placed as ``output_placements``.
        Differentiable (except with ``inplace=True``, where the result is a view of the input's
        storage, which it overwrites).
        """
        if isinstance(x, DTensor):
            lead = x.dim() - len(self.global_shape)
            layout, _ = dtensor_layout(x, len(self.global_shape), batch_axes_ok=False)
            if layout != self.layout:
                raise PlanError(
                    f"forward input: a DTensor laid out as {layout} does not match the plan's {self.layout}"
                )
            y = self._execute(x.to_local(), inverse=False)
            placements = shift_placements(self.output_placements, lead)
            return to_dtensor(y, x.device_mesh, placements, (*x.shape[:lead], *self.output_shape))
        return self._execute(x, inverse=False)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """The input block back from this rank's output block: ifftn, irfftn or the DCT-III (a DTensor
        placed as ``output_placements`` gives a DTensor of the field).

        ``inverse(forward(x)) == x`` to round-off. Differentiable (except with ``inplace=True``).
        """
        if isinstance(y, DTensor):
            lead = y.dim() - len(self.global_shape)
            expected = shift_placements(self.output_placements, lead)
            if y.device_mesh != self.layout.mesh or tuple(y.placements) != expected:
                raise PlanError(
                    f"inverse input: placements {y.placements} on {y.device_mesh}, expected {expected} on "
                    f"{self.layout.mesh}"
                )
            if lead < 0 or tuple(y.shape[lead:]) != self.output_shape:
                raise PlanError(
                    f"inverse input: a DTensor of shape {tuple(y.shape)}, expected (*batch, *{self.output_shape})"
                )
            x = self._execute(y.to_local(), inverse=True)
            placements = shift_placements(self.layout.placements, lead)
            return to_dtensor(x, y.device_mesh, placements, (*y.shape[:lead], *self.global_shape))
        return self._execute(y, inverse=True)
