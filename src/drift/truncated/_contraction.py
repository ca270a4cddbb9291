"""The contraction order of a ``TruncatedFFT``'s partial DFTs and what it costs: FLOPs per stage, the
copy a real field's conjugate fold makes, the order of least cost (``best_order``) and a plan's FLOPs
(``transform_flops``, the interface cost models use)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from drift.truncated._stages import conjugate_fold


def folded_rows(modes: Sequence[int], n: int) -> int:
    """Rows of a real stage's gemm for the kept frequencies ``modes`` of extent ``n`` (``conjugate_fold``):
    a real part for each frequency up to sign, an imaginary part for each of those but 0 and n / 2."""
    return conjugate_fold(modes, n).rows


def contraction_flops(
    order: Sequence[int],
    local: Sequence[int],
    kept: Sequence[int],
    real: bool,
    rows: Sequence[int] | None = None,
) -> int:
    """Forward FLOPs of one field when the dims are contracted in ``order``: a complex gemm per stage
    (8 real FLOPs per multiply-add). When ``real`` the first stage is a real gemm: innermost (or where
    ``rows`` is None, the count without folding) it produces ``2 * kept[dim]`` real values per line;
    otherwise ``rows[dim]`` real rows (``folded_rows``), on which the second stage is a real gemm with its
    basis' real and imaginary parts (4 FLOPs per complex multiply-add)."""
    sizes = list(local)
    total = 0
    folded = None  # the dim whose real rows the next stage takes
    for step, dim in enumerate(order):
        rest = math.prod(sizes[:dim] + sizes[dim + 1 :])
        if real and step == 0:
            if rows is None or math.prod(sizes[dim + 1 :]) == 1:
                total += 2 * rest * sizes[dim] * 2 * kept[dim]
            else:
                total += 2 * rest * sizes[dim] * rows[dim]
                folded = dim
                sizes[dim] = rows[dim]
                continue
        elif folded is not None:
            total += 4 * rest * sizes[dim] * kept[dim]
            sizes[folded], folded = kept[folded], None
        else:
            total += 8 * rest * sizes[dim] * kept[dim]
        sizes[dim] = kept[dim]
    return total


# The cost of the copy between folded real rows and complex values that a real field's first two stages
# make when the first one's dim is not innermost, in FLOP-equivalents per real value copied, measured on a
# 2-core AVX-512 host: the forward's expansion into complex values is cheap, the inverse's (and the forward
# adjoint's) fold of complex values into real rows, strided, is not. Innermost-first orders make no copy.
FORWARD_COPY_FLOPS = 16
INVERSE_COPY_FLOPS = 144


def interleave_copy(order: Sequence[int], local: Sequence[int], kept: Sequence[int], real: bool) -> int:
    """Real values one field's first two stages in ``order`` copy between folded real rows and complex
    values: the second forward stage's complex output (the second-to-last inverse stage's complex input),
    or 0 when the first stage's dim is innermost (interleaved columns, a free view) or the field is
    complex."""
    first = order[0]
    if not real or math.prod(local[first + 1 :]) == 1:
        return 0
    return 2 * math.prod(kept[i] if i in order[:2] else n for i, n in enumerate(local))


def best_order(
    local: Sequence[int],
    kept: Sequence[int],
    real: bool,
    copy_flops: float = 0,
    rows: Sequence[int] | None = None,
    last: int | None = None,
) -> tuple[tuple[int, ...], int]:
    """The contraction order of least cost, FLOPs (``contraction_flops`` with ``rows``) plus
    ``copy_flops`` per value of its interleaving copy (``interleave_copy``), and its FLOPs; of the
    orders ending in dim ``last`` when it is given. ``copy_flops=0``: the fewest FLOPs. Ties go to the
    order whose first stage has the most lines before its dim, then lexicographically: that stage is then
    a batched gemm, which threads share well, rather than one thin gemm per field (at 128 x 128 x 64 x 30,
    (1, 0, 2, 3) ran the forward in 0.60x the time of (0, 1, 2, 3) on two threads, with the same FLOPs)."""

    def cost(order: tuple[int, ...]) -> tuple[float, int, tuple[int, ...]]:
        copied = interleave_copy(order, local, kept, real)
        flops = contraction_flops(order, local, kept, real, rows) + copy_flops * copied
        return flops, -math.prod(local[: order[0]]), order

    orders = [o for o in itertools.permutations(range(len(local))) if last is None or o[-1] == last]
    order = min(orders, key=cost)
    return order, contraction_flops(order, local, kept, real, rows)


def transform_flops(
    local_shape: Sequence[int], modes: Sequence[Sequence[int]], extents: Sequence[int], real: bool
) -> tuple[int, int]:
    """Real FLOPs of one field's forward and inverse partial DFTs on a block of ``local_shape``, keeping
    ``modes`` (per dim, the kept indices of ``extents``, the padded global shape) in the orders a
    ``TruncatedFFT`` chooses: its ``flops`` and ``inverse_flops``. The interface the cost models use."""
    (_, forward), (_, inverse) = plan_orders(local_shape, modes, extents, real)
    return forward, inverse


def slab_order(local_shape, modes, extents, real) -> tuple[int, ...]:
    """The order whose reverse an inverse contracts in when it runs a slab of dim 0 at a time
    (``TruncatedFFT.inverse_slab``): ``plan_orders``' inverse among the orders ending in dim 0."""
    kept = [len(m) for m in modes]
    rows = [folded_rows(m, n) for m, n in zip(modes, extents, strict=True)]
    return best_order(local_shape, kept, real, INVERSE_COPY_FLOPS, rows, last=0)[0]


def plan_orders(local_shape, modes, extents, real) -> tuple[tuple[tuple[int, ...], int], tuple[tuple[int, ...], int]]:
    """The forward's contraction order and FLOPs, and the inverse's (``best_order`` with their copies)."""
    kept = [len(m) for m in modes]
    rows = [folded_rows(m, n) for m, n in zip(modes, extents, strict=True)]
    forward = best_order(local_shape, kept, real, FORWARD_COPY_FLOPS, rows)
    return forward, best_order(local_shape, kept, real, INVERSE_COPY_FLOPS, rows)
