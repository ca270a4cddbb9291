"""``method="auto"``: the spectral convolution method a cost model predicts fastest for a grid, modes and mesh.

The model counts, for one sample's forward spectral path (the transform of ``in`` channels and the
inverse of ``out`` channels; the channel mixing is the same for every method and left out):

- "drift": the partial-DFT contractions on the local block in the orders its plans choose (the forward's
  and the inverse's, ``drift.truncated.best_order`` with their copy weights), at the machine's matmul
  rate; one reduce-scatter of the ``in x M`` spectrum per split dim and one all-gather of the ``out x M``
  one back (ring terms, ``Machine.collective_s``).
- "dfno-pruned": 1-D FFTs dim by dim from the last, each truncated to its kept modes before the next
  (2.5 n log2 n FLOPs per real line of n, 5 n log2 n per complex one), split evenly over the ranks, at
  the machine's FFT rate; per split dim one all-to-all each way of the field with every other dim
  already truncated.

"dfno" (Grady et al.'s baseline, which moves the whole field) is never faster than "dfno-pruned" and
is not a candidate. The model is a model: it decides between methods whose costs differ by large
factors (k << N against every mode kept), not between near-equal ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from drift.errors import PlanError
from drift.truncated import FORWARD_COPY_FLOPS, INVERSE_COPY_FLOPS, ModeSpec, best_order, folded_rows, mode_lists

CANDIDATES = ("drift", "dfno-pruned")


@dataclass(frozen=True)
class Machine:
    """Rates of the machine a model runs on: dense matmul and FFT FLOP/s (FFT FLOPs counted as 5 n log2 n
    per complex line of n), seconds per collective latency step (alpha) and per byte a rank sends (beta)."""

    matmul_flops_per_s: float
    fft_flops_per_s: float
    alpha_s: float
    beta_s_per_byte: float

    @classmethod
    def default(cls, device_type: str = "cpu") -> Machine:
        """Round figures of effective rates, what drift's plans reach rather than kernel peaks: "cpu", a
        2-core host with Gloo on loopback (``drift bench comm``'s fit: alpha 0.5-1.8 ms, 0.4-1 GB/s; at
        64 x 64 x 32 x 30, modes (8, 8, 8, 16), one block's drift transforms do ~17 GFLOP in ~0.3 s and
        dfno-pruned's ~5.6 GFLOP of FFTs take ~1.1 s of its 1.4 s: docs/BENCHMARKS.md); "cuda", the DRIFT
        paper's GPUs (alpha 165 us, 6.5 GB/s, 0.78 TFLOP/s effective on partial DFTs; cuFFT, memory
        bound, taken at a quarter of that: not measured here, so ``measure`` on the GPU where it matters)."""
        if device_type == "cuda":
            return cls(7.8e11, 1.95e11, 1.65e-4, 1.53e-10)
        return cls(5e10, 5e9, 1e-3, 1.5e-9)

    @classmethod
    def measure(cls, device: torch.device | str = "cpu", *, alpha_s: float, beta_s_per_byte: float) -> Machine:
        """The matmul and FFT kernel rates measured here (a thin complex gemm and batched complex FFTs,
        best of 3), with the given collective terms. Kernel rates leave out the copies and truncations
        around a plan's FFTs, which ``default`` counts. Measured rates differ between ranks and runs:
        measure on one rank and give every rank the same ``Machine``."""
        device = torch.device(device)
        a = torch.randn(4096, 256, dtype=torch.complex64, device=device)
        b = torch.randn(256, 16, dtype=torch.complex64, device=device)
        lines = torch.randn(4096, 256, dtype=torch.complex64, device=device)
        matmul = _best_seconds(lambda: a @ b, device) / (8 * 4096 * 256 * 16)
        fft = _best_seconds(lambda: torch.fft.fft(lines), device) / (5 * 4096 * 256 * math.log2(256))
        return cls(1 / matmul, 1 / fft, alpha_s, beta_s_per_byte)

    def collective_s(self, kind: str, ranks: int, nbytes: float) -> float:
        """Ring model of one collective over ``ranks`` on an ``nbytes`` buffer (the whole, all ranks'
        shares): (P - 1) alpha + (P - 1) / P n beta for a reduce-scatter, all-gather or all-to-all."""
        if ranks == 1:
            return 0.0
        if kind not in ("reduce_scatter", "all_gather", "all_to_all"):
            raise ValueError(f"no model for collective {kind!r}")
        return (ranks - 1) * self.alpha_s + (ranks - 1) / ranks * nbytes * self.beta_s_per_byte


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


def method_costs(
    global_shape: Sequence[int],
    modes: Sequence[ModeSpec],
    parts: Sequence[int],
    *,
    in_channels: int,
    out_channels: int,
    real: bool = True,
    complex_bytes: int = 8,
    machine: Machine,
) -> list[MethodCost]:
    """The modelled forward cost of each candidate for one sample of ``global_shape`` split ``parts``
    ways per dim (1: whole), cheapest first. ValueError if ``modes`` do not fit ``global_shape``."""
    shape, parts = tuple(global_shape), tuple(parts)
    lists = mode_lists(tuple(modes), shape, real)
    kept = [len(m) for m in lists]
    rows = [folded_rows(m, n) for m, n in zip(lists, shape, strict=True)]
    ranks, modes_total = math.prod(parts), math.prod(kept)
    local = [math.ceil(n / p) for n, p in zip(shape, parts, strict=True)]
    forward_flops = best_order(local, kept, real, FORWARD_COPY_FLOPS, rows)[1]
    inverse_flops = best_order(local, kept, real, INVERSE_COPY_FLOPS, rows)[1]
    drift_flops = in_channels * forward_flops + out_channels * inverse_flops
    drift_bytes, drift_comm, share = 0.0, 0.0, 1
    for p in (p for p in parts if p > 1):
        for kind, c in (("reduce_scatter", in_channels), ("all_gather", out_channels)):
            nbytes = c * modes_total * complex_bytes / share
            drift_comm += machine.collective_s(kind, p, nbytes)
            drift_bytes += (p - 1) / p * nbytes
        share *= p

    fft_flops, volume = 0.0, math.prod(shape)
    for dim in reversed(range(len(shape))):
        n = shape[dim]
        per_line = (2.5 if real and dim == len(shape) - 1 else 5.0) * n * math.log2(max(n, 2))
        fft_flops += volume / n * per_line
        volume = volume // n * kept[dim]
    dfno_flops = (in_channels + out_channels) * fft_flops / ranks
    dfno_bytes, dfno_comm = 0.0, 0.0
    # When a split dim is transformed every whole dim already is, and truncated.
    moved = math.prod(n if p > 1 else k for n, k, p in zip(shape, kept, parts, strict=True))
    for p in (p for p in parts if p > 1):
        for c in (in_channels, out_channels):
            nbytes = c * moved * complex_bytes / ranks  # each rank's block, (p - 1) / p of it sent
            dfno_comm += machine.collective_s("all_to_all", p, nbytes)
            dfno_bytes += (p - 1) / p * nbytes
    costs = [
        MethodCost("drift", drift_flops, drift_bytes, drift_flops / machine.matmul_flops_per_s, drift_comm),
        MethodCost("dfno-pruned", dfno_flops, dfno_bytes, dfno_flops / machine.fft_flops_per_s, dfno_comm),
    ]
    return sorted(costs, key=lambda c: (c.seconds, CANDIDATES.index(c.method)))


def choose_method(
    global_shape: Sequence[int],
    modes: Sequence[ModeSpec],
    parts: Sequence[int],
    *,
    excluded: Sequence[str] = (),
    **model,
) -> MethodChoice:
    """The cheapest candidate by ``method_costs`` (``model``: its keyword arguments, ``machine``,
    ``in_channels``, ...), none of ``excluded``; PlanError, naming the grid and the modes, when no
    candidate can run them."""
    try:
        costs = method_costs(global_shape, modes, parts, **model)
    except ValueError as exc:
        raise PlanError(f"method='auto' at resolution {tuple(global_shape)}: no method fits ({exc})") from None
    costs = [c for c in costs if c.method not in excluded]
    if not costs:
        raise PlanError(
            f"method='auto' at resolution {tuple(global_shape)}: no method fits ({', '.join(excluded)} excluded)"
        )
    return MethodChoice(costs[0].method, tuple(costs), tuple(global_shape), tuple(parts))
