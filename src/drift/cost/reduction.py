"""drift's reduce-scatter and all-gather of a spectrum over a reduction mesh: their cost, and the mesh to take.

A reduction mesh (``parallelize``'s ``reduction``, ``drift.layout.split_reduction``) runs each split dim's
reduce-scatter as one per level, the last level (its ranks adjacent) first, each over what the previous
left; the all-gathers mirror them. Every shape of P ranks sends the same bytes from each rank; shapes
differ in latency steps, sum(P_i - 1), in the pass each level makes over its buffer and, across hosts,
in what crosses a host's link. Two choices are made by the model:

- ``choose_reduction`` (``reduction="auto"``, ``method="auto"``): over every split dim at once, on a
  ``Machine`` (hosts and copies included); one level per split dim unless another shape is faster.
- ``best_reduction`` and ``drift_reduction`` (``drift bench comm``'s projection): per split dim, on one
  link (a ``Fit``: where a group's ranks are does not matter), its shares padded as
  ``Layout.reduce_scatter_shares`` pads them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from drift.cost.collectives import Fit
from drift.cost.machine import Machine
from drift.layout import split_reduction


def factorisations(size: int) -> list[tuple[int, ...]]:
    """Every reduction mesh shape of ``size`` ranks: the ordered factorisations into factors >= 2
    (``(size,)`` itself, the flat reduction, among them; ``()`` for one rank)."""
    if size == 1:
        return [()]
    return [(f, *rest) for f in range(2, size + 1) if size % f == 0 for rest in factorisations(size // f)]


def reduction_levels(parts: Sequence[int], reduction: Sequence[int] | None = None) -> list[list[tuple[int, int]]]:
    """Per split dim (``parts`` > 1, in order), the ``(ranks, stride)`` of each level of drift's reduction
    of it, outermost first: the dims of ``reduction`` that split it (``drift.layout.split_reduction``),
    or the dim itself without one. Ranks are numbered with the last level fastest."""
    split = [p for p in parts if p > 1]
    shape = tuple(split) if reduction is None else tuple(reduction)
    stride, levels = math.prod(shape), []
    for dims in split_reduction(shape, split):
        levels.append([])
        for d in dims:
            stride //= shape[d]
            levels[-1].append((shape[d], stride))
    return levels


def spectrum_collectives(
    machine: Machine, levels: list[list[tuple[int, int]]], in_channels: int, out_channels: int, spectrum_bytes: float
) -> tuple[float, float]:
    """Bytes each rank sends and seconds of drift's reduce-scatters (``in`` channels) and all-gathers
    (``out``) of a ``spectrum_bytes`` spectrum per channel over ``reduction_levels``, each level's pass
    over its buffer included."""
    sent, seconds, share = 0.0, 0.0, 1
    for dim in levels:
        for kind, channels in (("reduce_scatter", in_channels), ("all_gather", out_channels)):
            nbytes = channels * spectrum_bytes / share
            for ranks, stride in reversed(dim):  # the all-gather mirrors the reduce-scatter's sizes
                seconds += machine.collective_s(kind, ranks, nbytes, stride) + nbytes * machine.copy_s_per_byte
                sent += (ranks - 1) / ranks * nbytes
                nbytes /= ranks
        share *= math.prod(ranks for ranks, _ in dim)
    return sent, seconds


def choose_reduction(
    parts: Sequence[int], spectrum_bytes: float, *, in_channels: int, out_channels: int, machine: Machine
) -> tuple[int, ...] | None:
    """The reduction mesh shape (``parallelize``'s ``reduction``) with which drift's collectives of a
    ``spectrum_bytes`` spectrum per channel over split dims of ``parts`` ranks are modelled fastest: per
    split dim one of its ``factorisations``; None (one level per split dim) unless another is faster."""
    split = [p for p in parts if p > 1]

    def seconds(reduction: tuple[int, ...] | None) -> float:
        levels = reduction_levels(parts, reduction)
        return spectrum_collectives(machine, levels, in_channels, out_channels, spectrum_bytes)[1]

    best, best_s = None, seconds(None)
    for shape in itertools.product(*(factorisations(p) for p in split)):
        flat = tuple(f for dim in shape for f in dim)
        if (candidate := seconds(flat)) < best_s * (1 - 1e-9):  # a faster shape, not a rounding tie
            best, best_s = flat, candidate
    return best


def reduction_seconds(model: Fit, shape: Sequence[int], nbytes: float) -> float:
    """Modelled seconds of drift's reduce-scatter of an ``nbytes`` spectrum over a reduction mesh of
    ``shape`` and the all-gather back (``Layout`` with ``reduction``): one reduce-scatter per mesh dim,
    the last first, each over what the previous left (the all-gathers mirror them)."""
    seconds = 0.0
    for parts in reversed(shape):
        seconds += model.predict("reduce_scatter", parts, nbytes) + model.predict("all_gather", parts, nbytes)
        nbytes /= parts
    return seconds


def best_reduction(model: Fit, size: int, nbytes: float) -> tuple[tuple[int, ...], float]:
    """The reduction mesh shape of ``size`` ranks with the least modelled time (ties: fewer levels, then
    the larger last factor, the most ranks reduced first), and that time. Every shape sends the same
    bytes, so the latency steps sum(P_i - 1) decide: with one alpha for every link, factors of 2."""
    shapes = factorisations(size)
    return min(
        ((shape, reduction_seconds(model, shape, nbytes)) for shape in shapes),
        key=lambda item: (round(item[1], 15), len(item[0]), tuple(reversed([-f for f in item[0]]))),
    )


def drift_reduction(
    model: Fit, parts: Sequence[int], rows: int, row_bytes: float, *, factorise: bool = True
) -> tuple[tuple[int, ...], float]:
    """The reduction mesh shape and modelled seconds of drift's reduce-scatter and all-gather of a
    spectrum of ``rows`` first-mode rows of ``row_bytes`` each over a grid whose split dims have
    ``parts`` ranks (``Layout.reduce_scatter_shares``): per split dim in turn, the rows left padded to
    a multiple of its ranks (torch.chunk shares; beyond ``rows`` ranks the blocks are zero rows) and
    reduced over its fastest factorisation (``best_reduction``; one level without ``factorise``)."""
    shape, seconds = [], 0.0
    for p in parts:
        c = -(-rows // p)
        payload = p * c * row_bytes
        levels = best_reduction(model, p, payload)[0] if factorise else (p,)
        shape += levels
        seconds += reduction_seconds(model, levels, payload)
        rows = c
    return tuple(shape), seconds
