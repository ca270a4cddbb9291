"""Retained modes: which Fourier frequencies a transform keeps, and the implicit zero padding it
transforms over; shared by both transforms (``drift.truncated``, ``drift.fft``) and the layers.

A mode spec per dim is Li et al.'s int k (frequencies 0..k-1 and -k..-1, or 0..k-1 on the half
spectrum of a real transform's last dim) or an explicit list of frequency indices (negative ones
counted from the end). A padding spec gives zeros before and after each dim.
"""

from __future__ import annotations

from collections.abc import Sequence

ModeSpec = int | Sequence[int]
PaddingSpec = int | Sequence[int | Sequence[int]]


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


def padding_pairs(padding: PaddingSpec | None, global_shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """``(before, after)`` zeros per dim: None pads nothing; an int p pads p zeros after every dim;
    a sequence has one entry per dim, an int p (p zeros after) or a pair ``(before, after)``. Each side
    takes at most the dim's extent N of zeros (ValueError naming ``padding`` otherwise)."""
    d = len(global_shape)
    if padding is None:
        return ((0, 0),) * d
    if isinstance(padding, int) and not isinstance(padding, bool):
        padding = (padding,) * d
    if not isinstance(padding, Sequence) or len(padding) != d:
        raise ValueError(f"padding needs an int or one entry per dim of global_shape {global_shape}, got {padding!r}")
    pairs = []
    for dim, (spec, n) in enumerate(zip(padding, global_shape, strict=True)):
        pair = (0, spec) if isinstance(spec, int) and not isinstance(spec, bool) else spec
        if (
            not isinstance(pair, Sequence)
            or len(pair) != 2
            or any(isinstance(p, bool) or not isinstance(p, int) for p in pair)
        ):
            raise ValueError(f"padding on dim {dim} must be an int or a pair (before, after) of ints, got {spec!r}")
        if not all(0 <= p <= n for p in pair):
            raise ValueError(f"padding on dim {dim}: {spec!r} must be between 0 and the extent {n} on each side")
        pairs.append(tuple(pair))
    return tuple(pairs)


def mode_counts(modes: Sequence[ModeSpec], real: bool) -> tuple[int, ...]:
    """``(K1, ..., Kd)``: retained modes per dim for per-dim specs (an int k keeps 2k, or k on the
    last dim of a real layer; a list keeps its entries), whatever the resolution."""
    if isinstance(modes, int) or not isinstance(modes, Sequence) or not 1 <= len(modes) <= 4:
        raise ValueError(f"modes needs one entry per spatial dim (1 to 4 dims), got {modes!r}")
    counts = []
    for dim, spec in enumerate(modes):
        if isinstance(spec, bool) or not isinstance(spec, int | Sequence):
            raise ValueError(f"modes on dim {dim} must be an int or a sequence of ints, got {spec!r}")
        if isinstance(spec, int):
            if spec < 1:
                raise ValueError(f"modes on dim {dim}: k = {spec} must be at least 1")
            counts.append(spec if real and dim == len(modes) - 1 else 2 * spec)
        else:
            if len(spec) == 0:
                raise ValueError(f"modes on dim {dim}: the index list is empty")
            counts.append(len(spec))
    return tuple(counts)
