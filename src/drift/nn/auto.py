"""``method="auto"``: the spectral convolution method a cost model predicts fastest for a grid, modes and mesh.

The model counts, for one sample's forward spectral path (the transform of ``in`` channels and the
inverse of ``out`` channels; the channel mixing is the same for every method and left out):

- "drift": the partial-DFT contractions on the local block in the orders its plans choose (the forward's
  and the inverse's, ``drift.truncated.best_order`` with their copy weights), at the machine's matmul
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
is not a candidate.

On several hosts (``Machine.hosts``) a collective whose group spans hosts is timed by what crosses
each host's link: latency steps at the link's alpha, and the bytes every group of the mesh dim sends
out of a host at once at its beta (a ring sends (P - 1) / P of the vector out of a host per group, an
all-to-all q (P - q) / P of it with q of the group's ranks on the host). Ranks are numbered host by
host, as torchrun numbers them. The model is a model: it decides between methods whose costs differ by large
factors (k << N against every mode kept), not between near-equal ones.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from drift.contraction import transform_flops
from drift.errors import PlanError
from drift.layout import split_reduction
from drift.modes import ModeSpec, mode_lists


@dataclass(frozen=True)
class Hosts:
    """The hosts the ranks run on: ``ranks_per_host`` consecutive ranks on each, joined by links of
    ``alpha_s`` seconds per latency step and ``beta_s_per_byte`` per byte through a host's link."""

    ranks_per_host: int
    alpha_s: float
    beta_s_per_byte: float


@dataclass(frozen=True)
class Machine:
    """Rates of the machine a model runs on: dense matmul and FFT FLOP/s (FFT FLOPs counted as 5 n log2 n
    per complex line of n), seconds per collective latency step (alpha) and per byte a rank sends (beta)
    between ranks of a host; ``hosts``: the hosts and the links between them (None: one host);
    ``pairwise_reduce_scatter``: drift's reduce-scatter runs as an all-to-all and a local sum (on CPU
    ranks, ``drift.comm``), not as a ring; ``copy_s_per_byte``: seconds per byte of the pass a rank makes
    over a collective's buffer (laying out its blocks, summing the parts it received)."""

    matmul_flops_per_s: float
    fft_flops_per_s: float
    alpha_s: float
    beta_s_per_byte: float
    hosts: Hosts | None = None
    pairwise_reduce_scatter: bool = False
    copy_s_per_byte: float = 0.0

    @classmethod
    def default(cls, device_type: str = "cpu") -> Machine:
        """Round figures of effective rates, what drift's plans reach rather than kernel peaks: "cpu", a
        2-core host with Gloo on loopback (``drift bench comm``'s fit and the block timings of
        docs/BENCHMARKS.md); "cuda", the DRIFT paper's GPUs (its measured collectives and partial DFTs;
        cuFFT, memory bound, taken at a quarter of the partial DFTs' rate: not measured here, so
        ``measure`` on the GPU where it matters). One host: give ``hosts`` for several."""
        if device_type == "cuda":
            return cls(7.8e11, 1.95e11, 1.65e-4, 1.53e-10, copy_s_per_byte=1e-12)
        # A copy into a fresh buffer at 2.5 GB/s: one of two ranks sharing a core.
        return cls(5e10, 5e9, 1e-3, 1.5e-9, pairwise_reduce_scatter=True, copy_s_per_byte=4e-10)

    @classmethod
    def measure(
        cls, device: torch.device | str = "cpu", *, alpha_s: float, beta_s_per_byte: float, hosts: Hosts | None = None
    ) -> Machine:
        """The matmul and FFT kernel rates and the copy rate measured here (a thin complex gemm, batched
        complex FFTs and a transposing copy into a fresh buffer, best of 3), with the given collective
        terms. Kernel rates leave out the copies and truncations around a plan's FFTs, which ``default``
        counts. Measured rates differ between ranks and runs:
        measure on one rank and give every rank the same ``Machine``."""
        device = torch.device(device)
        a = torch.randn(4096, 256, dtype=torch.complex64, device=device)
        b = torch.randn(256, 16, dtype=torch.complex64, device=device)
        lines = torch.randn(4096, 256, dtype=torch.complex64, device=device)
        matmul = _best_seconds(lambda: a @ b, device) / (8 * 4096 * 256 * 16)
        fft = _best_seconds(lambda: torch.fft.fft(lines), device) / (5 * 4096 * 256 * math.log2(256))
        blocks = lines.view(64, 4, -1)
        copy = _best_seconds(lambda: blocks.movedim(1, 0).contiguous(), device) / (lines.numel() * lines.element_size())
        pairwise = device.type == "cpu"
        return cls(1 / matmul, 1 / fft, alpha_s, beta_s_per_byte, hosts, pairwise, copy_s_per_byte=copy)

    def collective_s(self, kind: str, ranks: int, nbytes: float, stride: int = 1) -> float:
        """Seconds of one collective over a group of ``ranks`` ranks ``stride`` apart (a mesh dim's group,
        every group of that dim at once) on an ``nbytes`` buffer (the whole, all ranks' shares). Within a
        host: (P - 1) alpha + (P - 1) / P n beta for a reduce-scatter, all-gather or all-to-all. Across
        hosts: (P - 1) alpha_h + B beta_h, B the bytes out of each host (the module docstring)."""
        if kind not in ("reduce_scatter", "all_gather", "all_to_all"):
            raise ValueError(f"no model for collective {kind!r}")
        if ranks == 1:
            return 0.0
        per_host = self.hosts.ranks_per_host if self.hosts is not None else ranks * stride
        on_host = max(1, min(ranks, per_host // stride))  # the group's ranks on each of its hosts
        if on_host == ranks:
            return (ranks - 1) * self.alpha_s + (ranks - 1) / ranks * nbytes * self.beta_s_per_byte
        groups = per_host // on_host  # the dim's groups that share a host's link
        if kind == "all_to_all" or (kind == "reduce_scatter" and self.pairwise_reduce_scatter):
            out = groups * on_host * (ranks - on_host) / ranks * nbytes
        else:
            out = groups * (ranks - 1) / ranks * nbytes
        return (ranks - 1) * self.hosts.alpha_s + out * self.hosts.beta_s_per_byte


def _best_seconds(fn, device: torch.device, repeats: int = 3) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - began)
    return best


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


def _drift_comm(machine: Machine, levels, in_channels: int, out_channels: int, spectrum_bytes: float):
    """Bytes each rank sends and seconds of drift's reduce-scatters (``in`` channels) and all-gathers
    (``out``) of a ``spectrum_bytes`` spectrum per channel over ``reduction_levels``."""
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
    best, best_s = None, _drift_comm(machine, reduction_levels(parts), in_channels, out_channels, spectrum_bytes)[1]
    for shape in itertools.product(*(factorisations(p) for p in split)):
        flat = tuple(f for dim in shape for f in dim)
        seconds = _drift_comm(machine, reduction_levels(parts, flat), in_channels, out_channels, spectrum_bytes)[1]
        if seconds < best_s * (1 - 1e-9):
            best, best_s = flat, seconds
    return best


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
    sent, seconds = _drift_comm(machine, levels, p.in_channels, p.out_channels, math.prod(kept) * p.complex_bytes)
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
