"""What ``method="auto"`` chooses by: each spectral convolution method's modelled seconds, and the cheapest.

The model counts, for one sample's forward spectral path (the transform of ``in`` channels and the
inverse of ``out`` channels; the channel mixing is the same for every method and left out):

- "drift": the partial-DFT contractions on the local block in the orders its plans choose (the forward's
  and the inverse's, ``drift.truncated._contraction.best_order`` with their copy weights), at the machine's matmul
  rate; one reduce-scatter of the ``in x M`` spectrum per split dim and one all-gather of the ``out x M``
  one back (``Machine.collective_s``), one per level of its reduction mesh when it has one
  (``choose_reduction`` finds the fastest); each level also passes over its buffer on the rank (its
  blocks laid out for the level's group, a reduce-scatter's received parts summed) at the machine's
  copy rate, which is what a reduction of the same bytes in more levels costs beyond its latency steps.
- "dfno-pruned": 1-D FFTs dim by dim from the last, each truncated to its kept modes before the next
  (2.5 n log2 n FLOPs per real line of n, 5 n log2 n per complex one), split evenly over the ranks, at
  the machine's FFT rate; per split dim one all-to-all each way of the field with every other dim
  already truncated, and its pass over the buffer (packing) at the copy rate.

"dfno" (Grady et al.'s baseline, which moves the whole field) is never faster than "dfno-pruned" and
is not a candidate. The model is a model: it decides between methods whose costs differ by large
factors (k << N against every mode kept), not between near-equal ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from drift.cost.machine import Machine
from drift.cost.reduction import reduction_levels, spectrum_collectives
from drift.errors import PlanError
from drift.modes import ModeSpec, mode_lists
from drift.truncated import transform_flops


@dataclass(frozen=True)
class MethodCost:
    """Modelled seconds of one method: computation and communication, and the FLOPs and bytes behind them."""

    method: str
    flops: float
    bytes_sent: float
    compute_s: float
    comm_s: float

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s

    def __str__(self) -> str:
        return (
            f"{self.method} {self.seconds * 1e3:.3g} ms ({self.flops / 1e9:.3g} GFLOP, "
            f"{self.bytes_sent / 1e6:.3g} MB sent per rank)"
        )


@dataclass(frozen=True)
class MethodChoice:
    """The method ``choose_method`` picked and every candidate's modelled cost, cheapest first."""

    method: str
    costs: tuple[MethodCost, ...]
    grid: tuple[int, ...]
    parts: tuple[int, ...]

    def __str__(self) -> str:
        where = "x".join(map(str, self.grid))
        split = "x".join(map(str, self.parts))
        return f"auto chose {self.method} at {where} on {split} ranks: " + ", ".join(map(str, self.costs))


@dataclass(frozen=True)
class Problem:
    """What a cost model costs: one sample of ``global_shape`` with ``modes`` kept, split ``parts`` ways
    per dim (1: whole; ranks numbered with the last split dim fastest), ``in_channels`` transformed
    forward and ``out_channels`` back, ``complex_bytes`` a spectral value, on ``machine``; drift's
    collectives over a reduction mesh of shape ``reduction`` (None: one level per split dim)."""

    global_shape: tuple[int, ...]
    modes: tuple
    parts: tuple[int, ...]
    in_channels: int
    out_channels: int
    machine: Machine
    real: bool = True
    complex_bytes: int = 8
    reduction: tuple[int, ...] | None = None

    @property
    def kept(self) -> list[int]:
        """Modes kept per dim (ValueError if they do not fit ``global_shape``)."""
        return [len(m) for m in mode_lists(self.modes, self.global_shape, self.real)]


def drift_cost(problem: Problem) -> MethodCost:
    """ "drift": the partial-DFT contractions of its plans and its reduce-scatters and all-gathers."""
    p, machine = problem, problem.machine
    lists = mode_lists(p.modes, p.global_shape, p.real)
    kept = [len(m) for m in lists]
    local = [math.ceil(n / q) for n, q in zip(p.global_shape, p.parts, strict=True)]
    forward_flops, inverse_flops = transform_flops(local, lists, p.global_shape, p.real)
    flops = p.in_channels * forward_flops + p.out_channels * inverse_flops
    levels = reduction_levels(p.parts, p.reduction)
    spectrum_bytes = math.prod(kept) * p.complex_bytes
    sent, seconds = spectrum_collectives(machine, levels, p.in_channels, p.out_channels, spectrum_bytes)
    return MethodCost("drift", flops, sent, flops / machine.matmul_flops_per_s, seconds)


def pruned_dfno_cost(problem: Problem) -> MethodCost:
    """ "dfno-pruned": truncated 1-D FFTs dim by dim from the last, and one all-to-all each way per split dim."""
    p, machine = problem, problem.machine
    shape, kept = p.global_shape, p.kept
    fft_flops, volume = 0.0, math.prod(shape)
    for dim in reversed(range(len(shape))):
        n = shape[dim]
        per_line = (2.5 if p.real and dim == len(shape) - 1 else 5.0) * n * math.log2(max(n, 2))
        fft_flops += volume / n * per_line
        volume = volume // n * kept[dim]
    ranks = math.prod(p.parts)
    flops = (p.in_channels + p.out_channels) * fft_flops / ranks
    sent, seconds = 0.0, 0.0
    # When a split dim is transformed every whole dim already is, and truncated.
    moved = math.prod(n if q > 1 else k for n, k, q in zip(shape, kept, p.parts, strict=True))
    for ((q, stride),) in reduction_levels(p.parts):
        for c in (p.in_channels, p.out_channels):
            nbytes = c * moved * p.complex_bytes / ranks  # each rank's block, (q - 1) / q of it sent
            seconds += machine.collective_s("all_to_all", q, nbytes, stride) + nbytes * machine.copy_s_per_byte
            sent += (q - 1) / q * nbytes
    return MethodCost("dfno-pruned", flops, sent, flops / machine.fft_flops_per_s, seconds)


COSTS = (drift_cost, pruned_dfno_cost)  # the candidates of method="auto", in order of preference on a tie


def method_costs(
    global_shape: Sequence[int],
    modes: Sequence[ModeSpec],
    parts: Sequence[int],
    *,
    costs: Sequence[Callable[[Problem], MethodCost]] = COSTS,
    **problem,
) -> list[MethodCost]:
    """The modelled forward cost of each candidate (``costs``, functions of a ``Problem``; ``problem``:
    its other fields) for one sample of ``global_shape`` split ``parts`` ways per dim, cheapest first
    (ties in the order of ``costs``). ValueError if ``modes`` do not fit ``global_shape``."""
    if problem.get("reduction") is not None:
        problem["reduction"] = tuple(problem["reduction"])
    p = Problem(tuple(global_shape), tuple(modes), tuple(parts), **problem)
    order = {cost: i for i, cost in enumerate(costs)}
    return [c for c, _ in sorted(((cost(p), order[cost]) for cost in costs), key=lambda t: (t[0].seconds, t[1]))]


def choose_method(
    global_shape: Sequence[int],
    modes: Sequence[ModeSpec],
    parts: Sequence[int],
    *,
    costs: Sequence[Callable[[Problem], MethodCost]] = COSTS,
    **problem,
) -> MethodChoice:
    """The cheapest candidate by ``method_costs``; PlanError, naming the grid and the modes, when no
    candidate can run them (or none is given)."""
    if not costs:
        raise PlanError(f"method='auto' at resolution {tuple(global_shape)}: no method fits this layout")
    try:
        ranked = method_costs(global_shape, modes, parts, costs=costs, **problem)
    except ValueError as exc:
        raise PlanError(f"method='auto' at resolution {tuple(global_shape)}: no method fits ({exc})") from None
    return MethodChoice(ranked[0].method, tuple(ranked), tuple(global_shape), tuple(parts))
