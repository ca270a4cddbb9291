"""The stages of a ``TruncatedFFT``: one basis contracted with one dim of a batch of fields each, in
chunks through resident buffers, with a real field's conjugate pairs folded into real rows (its
first stage computes each pair of kept frequencies once, ``conjugate_fold``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from drift._plan import Workspace, complex_dtype

SUM_BLOCK = 1024  # terms a single-precision contraction sums in one accumulator at most (``_contract``)


@dataclass(frozen=True)
class _Run:
    """Consecutive kept modes ``mode .. mode + length - 1`` whose folded frequencies sit in consecutive
    gemm rows from ``real_row`` (and ``imag_row``, None where the imaginary part is zero); ``conj``: the
    modes are the conjugates of those rows' frequencies; ``first``: the rows' first modes."""

    mode: int
    length: int
    real_row: int
    imag_row: int | None
    conj: bool
    first: bool


@dataclass(frozen=True)
class Fold:
    """A real stage's kept frequencies up to sign: a real field's coefficient at -f is the conjugate of
    that at f, so the gemm computes each pair once. ``frequencies``: one per pair (the least of f and
    n - f); the gemm's rows are their real parts, then the imaginary parts of those other than 0 and
    n / 2 (zero for every offset); ``runs`` map the rows to the kept modes."""

    frequencies: tuple[int, ...]
    imaginary: tuple[bool, ...]
    runs: tuple[_Run, ...]

    @property
    def rows(self) -> int:
        return len(self.frequencies) + sum(self.imaginary)

    @property
    def modes(self) -> int:
        return sum(run.length for run in self.runs)


def conjugate_fold(modes: Sequence[int], n: int) -> Fold:
    """The ``Fold`` of the kept frequencies ``modes`` (in their order) of extent ``n``."""
    least = [min(f, n - f) for f in modes]  # each kept frequency's representative up to sign
    frequencies = list(dict.fromkeys(least))
    imaginary = tuple(f > 0 and 2 * f != n for f in frequencies)
    with_imag = [s for s, has in enumerate(imaginary) if has]
    imag_row = {s: len(frequencies) + i for i, s in enumerate(with_imag)}
    runs: list[_Run] = []
    seen: set[int] = set()
    for i, (f, c) in enumerate(zip(modes, least, strict=True)):
        s = frequencies.index(c)
        run = _Run(i, 1, s, imag_row.get(s), c != f, s not in seen)
        seen.add(s)
        last = runs[-1] if runs else None
        if (
            last is not None
            and (last.conj, last.first, last.imag_row is None) == (run.conj, run.first, run.imag_row is None)
            and last.real_row + last.length == s
            and (run.imag_row is None or last.imag_row + last.length == run.imag_row)
        ):
            runs[-1] = replace(last, length=last.length + 1)
        else:
            runs.append(run)
    return Fold(tuple(frequencies), imaginary, tuple(runs))


def _expand_pairs(g: torch.Tensor, fold: Fold, axis: int, pair_axis: int, out: torch.Tensor) -> torch.Tensor:
    """The kept modes ``out`` (complex) from ``g``, the gemm of a basis' real and imaginary parts with a
    real stage's rows: ``g`` holds on ``pair_axis`` (extent 2) that product's real and imaginary parts,
    and on ``axis`` the rows (``fold.rows``), where ``out`` holds the kept modes. A row pair (R, I) of
    frequency f gives the mode ``g(R) + i g(I)`` at f and ``g(R) - i g(I)`` at -f."""
    real, imag = g.select(pair_axis, 0), g.select(pair_axis, 1)  # shaped as out, but rows on axis
    for run in fold.runs:
        target = out.narrow(axis, run.mode, run.length)
        yr, yi = real.narrow(axis, run.real_row, run.length), imag.narrow(axis, run.real_row, run.length)
        if run.imag_row is None:
            target.real.copy_(yr)
            target.imag.copy_(yi)
            continue
        zr, zi = real.narrow(axis, run.imag_row, run.length), imag.narrow(axis, run.imag_row, run.length)
        if torch.compiler.is_compiling():  # it does not trace out= into strided views
            sign = 1 if run.conj else -1
            target.real.copy_(yr + sign * zi)
            target.imag.copy_(yi - sign * zr)
        elif run.conj:
            torch.add(yr, zi, out=target.real)
            torch.sub(yi, zr, out=target.imag)
        else:
            torch.sub(yr, zi, out=target.real)
            torch.add(yi, zr, out=target.imag)
    return out


def _fold_pairs(t: torch.Tensor, fold: Fold, axis: int, pair_axis: int, parts: torch.Tensor) -> torch.Tensor:
    """The adjoint of ``_expand_pairs``: ``parts`` (real, the rows on ``axis``, extent 2 on ``pair_axis``)
    summed from the kept modes ``t`` (complex, the modes on ``axis``). A mode z at f adds (Re z, Im z) to
    its frequency's real row and (Im z, -Re z) to its imaginary row; at -f, (Re z, Im z) and (-Im z, Re z)."""
    real, imag = parts.select(pair_axis, 0), parts.select(pair_axis, 1)
    for run in fold.runs:
        source = t.narrow(axis, run.mode, run.length)
        rows = [(run.real_row, real, source.real, 1), (run.real_row, imag, source.imag, 1)]
        if run.imag_row is not None:
            sign = -1 if run.conj else 1
            rows += [(run.imag_row, real, source.imag, sign), (run.imag_row, imag, source.real, -sign)]
        for row, half, value, sign in rows:
            target = half.narrow(axis, row, run.length)
            if not run.first:
                target.add_(value, alpha=sign)
            elif sign > 0:
                target.copy_(value)
            else:
                torch.neg(value, out=target)
    return parts


@dataclass(frozen=True)
class Stage:
    """One per-dim gemm with the real or complex matrix in buffer ``name``, taking the dim to extent
    ``out``. ``right``: the dim is innermost in memory and the tensor is viewed (A, n) and multiplied on
    the right; otherwise it is viewed (A, n, B) and the matrix multiplies on the left. ``kind``:

    - "complex": complex input and output;
    - "real_in" / "real_out": real input, complex output / complex input, the real part of the output,
      on the right only: the matrix's columns (rows) interleave real and imaginary parts;
    - "real": real input and output (a real field's first forward stage on the left, whose output is
      folded real rows, and the inverse's last);
    - "fold_expand": the real rows ``fold`` of dim ``fold_dim`` in, complex out: a real gemm with the
      basis' real and imaginary parts, expanded to the kept modes of both dims (``_expand_pairs``);
    - "fold_reduce": its adjoint, complex in, the rows of ``fold_dim`` out (``_fold_pairs``, then the gemm).
    """

    dim: int
    name: str
    right: bool
    kind: str
    out: int
    fold: Fold | None = None
    fold_dim: int | None = None

    def extents(self, sizes: Sequence[int]) -> list[int]:
        """The field's extents after this stage, from ``sizes`` before it."""
        sizes = list(sizes)
        sizes[self.dim] = self.out
        if self.kind == "fold_expand":
            sizes[self.fold_dim] = self.fold.modes
        elif self.kind == "fold_reduce":
            sizes[self.fold_dim] = self.fold.rows
        return sizes


def _contract(
    t: torch.Tensor, matrix: torch.Tensor, right: bool, out: torch.Tensor, partials: torch.Tensor | None
) -> torch.Tensor:
    """``t @ matrix`` (``right``: ``t`` is ``(A, n)``) or ``matrix @ t`` (``t`` is ``(A, n, B)``) into ``out``;
    with ``partials`` (``(blocks, *out.shape)``) the product of each block of ``SUM_BLOCK`` terms goes to
    its own slot and the slots are summed: a gemv or thin gemm adds all n terms into one float32
    accumulator, which loses digits (7e-6 relative for a 1-D field of 65536 points, 8e-7 in blocks)."""
    if partials is None:
        return torch.matmul(t, matrix, out=out) if right else torch.matmul(matrix, t, out=out)
    n = matrix.shape[0] if right else matrix.shape[1]
    for i, start in enumerate(range(0, n, SUM_BLOCK)):
        length = min(SUM_BLOCK, n - start)
        if right:
            torch.matmul(t.narrow(1, start, length), matrix.narrow(0, start, length), out=partials[i])
        else:
            torch.matmul(matrix.narrow(1, start, length), t.narrow(1, start, length), out=partials[i])
    return torch.sum(partials, 0, out=out)


def apply_stage(
    t: torch.Tensor,
    stage: Stage,
    matrix: torch.Tensor,
    work: Workspace,
    key: tuple,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One stage on ``t`` (``(b, s1, ..., sd)``); intermediates go to ``work``, and the result into
    ``out`` when that is given (a contiguous tensor of the result's shape)."""

    def buffer(role: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return work.get((*key, role), tuple(shape), dtype, t.device)

    pos = stage.dim + 1
    new_shape = (t.shape[0], *stage.extents(t.shape[1:]))
    if stage.kind == "fold_reduce":
        folded = list(t.shape)
        folded[stage.fold_dim + 1] = stage.fold.rows
        parts = buffer("parts", (*folded[:pos], 2, *folded[pos:]), matrix.dtype)
        t = _fold_pairs(t, stage.fold, stage.fold_dim + 1, pos, parts)
        shape = (*folded[:pos], 2 * folded[pos], *folded[pos + 1 :])
    else:
        shape = t.shape
    lead, n, rest = math.prod(shape[:pos]), shape[pos], math.prod(shape[pos + 1 :])
    if stage.kind == "real_out":
        t = torch.view_as_real(t).reshape(lead, 2 * n)
    elif stage.right:
        t = t.reshape(lead, n)
    else:
        t = t.reshape(lead, n, rest)
    gemm_shape = (lead, matrix.shape[1]) if stage.right else (lead, matrix.shape[0], rest)
    if out is not None and stage.kind not in ("real_in", "fold_expand"):
        target = out.view(gemm_shape)
    else:
        target = buffer("gemm", gemm_shape, t.dtype)
    terms = matrix.shape[0] if stage.right else matrix.shape[1]
    partials = None
    if terms > SUM_BLOCK and t.dtype in (torch.float32, torch.complex64):
        partials = buffer("partials", (math.ceil(terms / SUM_BLOCK), *gemm_shape), t.dtype)
    result = _contract(t, matrix, stage.right, target, partials)
    if stage.kind == "real_in":
        result = torch.view_as_complex(result.view(lead, stage.out, 2))
        return result.view(new_shape) if out is None else out.copy_(result.view(new_shape))
    if stage.kind == "fold_expand":
        pairs = result.view(*shape[:pos], 2, stage.out, *shape[pos + 1 :])
        modes = buffer("complex", new_shape, complex_dtype(result.dtype)) if out is None else out.view(new_shape)
        return _expand_pairs(pairs, stage.fold, stage.fold_dim + 1, pos, modes)
    return result.view(new_shape)
