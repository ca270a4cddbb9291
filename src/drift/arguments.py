"""argparse types shared by ``drift``'s command line, ``drift bench`` and the scripts in benchmarks/."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type) -> Callable[[str], int | float]:
    """argparse type: a positive ``kind`` (int or float)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def extents(what: str, example: str, count: int | None = None) -> Callable[[str], tuple[int, ...]]:
    """argparse type: positive ints joined by ``x`` (``example``, like 64x64x32x30), ``count`` of them
    when given; its errors name ``what`` ("a shape", "a grid")."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(n) for n in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} like {example}") from None
        if min(values) < 1 or (count is not None and len(values) != count):
            many = f"{count} positive numbers" if count is not None else "positive numbers"
            raise argparse.ArgumentTypeError(f"{text!r}: {what} needs {many}, like {example}")
        return values

    return parse


def indices(text: str) -> tuple[int, ...]:
    """argparse type: whole numbers and inclusive ranges joined by commas, like 0,3,10-19, in that order."""
    chosen: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdecimal() or (dash and not last.isdecimal()) or (dash and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a list like 0,3,10-19")
        chosen.extend(range(int(first), int(last if dash else first) + 1))
    return tuple(chosen)


def count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return int(text)


def fourier_modes(text: str) -> tuple[int, ...]:
    """argparse type: Fourier modes per dim of the model (space, then time for a one-shot model), one count
    for every dim or one per dim, like 4 or 8,8,8,4."""
    try:
        counts = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode count like 4 or 8,8,8,4") from None
    if len(counts) > 4 or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need one to four positive counts (one per dim, or one for all)")
    return counts


def fractions(text: str) -> tuple[float, ...]:
    """argparse type: fractions in [0, 1] joined by commas, one for every dim or one per dim, like 0.125 or
    0.25,0.25,0."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction like 0.125 or 0.25,0.25,0") from None
    if not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each fraction must be between 0 and 1")
    return values


def auto_only(text: str) -> str:
    """argparse type of ``--resume``'s optional value: only ``auto``."""
    if text != "auto":
        raise argparse.ArgumentTypeError(f"{text!r}: --resume takes no value or auto")
    return text


positive_int = positive(int)
positive_float = positive(float)
shape = extents("a shape", "64x64x32x30")
rank_grid = extents("a grid", "4x1x1")
