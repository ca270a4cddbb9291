"""Domain padding of spectral convolutions, with neuraloperator 2.0's ``domain_padding`` values.

A fraction f of a spatial dim of N points pads ``round(f * N)`` zeros (Python's rounding, as
neuraloperator's ``DomainPadding``) on both sides ("symmetric", neuraloperator 2.0's only mode) or after
the field ("one-sided", neuraloperator's earlier default), recomputed from each resolution met. drift's
"drift" method pads implicitly through its bases (``TruncatedFFT(padding=...)``); the dfno methods pad
the tensor (``pad_block``) and crop their output (``crop_block``). For one convolution only the total
matters: a convolution over the padded period commutes with cyclic shifts, so "symmetric" with p zeros
a side computes what "one-sided" with 2p does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

PADDING_MODES = ("symmetric", "one-sided")


def padding_fractions(domain_padding: float | Sequence[float] | None, d: int) -> tuple[float, ...]:
    """The padding fraction of each of ``d`` spatial dims: None pads nothing, a number applies to every
    dim, else one number per dim, each in [0, 1] (ValueError naming ``domain_padding`` otherwise)."""
    if domain_padding is None:
        return (0.0,) * d
    values = (domain_padding,) * d if isinstance(domain_padding, int | float) else domain_padding
    if not isinstance(values, Sequence) or len(values) != d:
        raise ValueError(f"domain_padding needs a number or one per spatial dim ({d}), got {domain_padding!r}")
    for dim, f in enumerate(values):
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 <= f <= 1:
            raise ValueError(
                f"domain_padding on dim {dim}: {f!r} must be a fraction of the extent between 0 and 1 "
                "(at most N zeros a side)"
            )
    return tuple(float(f) for f in values)


def check_padding_mode(mode: str) -> str:
    if mode not in PADDING_MODES:
        raise ValueError(f"domain_padding_mode must be one of {PADDING_MODES}, got {mode!r}")
    return mode


def padding_at(fractions: Sequence[float], mode: str, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``(before, after)`` zeros per dim of a field of global ``shape``."""
    sides = [round(f * n) for f, n in zip(fractions, shape, strict=True)]
    return tuple((p, p) if mode == "symmetric" else (0, p) for p in sides)


def pad_block(x: torch.Tensor, padding: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``x`` ``(..., n1, ..., nd)`` with ``padding`` zeros around its last d dims (``x`` itself when
    there are none: no copy)."""
    if not any(b or a for b, a in padding):
        return x
    return F.pad(x, [side for pair in reversed(padding) for side in pair])


def crop_block(y: torch.Tensor, padding: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The real points of ``y``, a field padded as ``padding`` says on its last d dims."""
    d = len(padding)
    return y[(..., *(slice(b, y.shape[y.dim() - d + i] - a) for i, (b, a) in enumerate(padding)))]
