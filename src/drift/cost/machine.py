"""The machine a cost is modelled on: kernel rates, the links within and between hosts, and its presets.

On several hosts (``Machine.hosts``) a collective whose group spans hosts is timed by what crosses each
host's link: latency steps at the link's alpha, and the bytes every group of the mesh dim sends out of
a host at once at its beta (a ring sends (P - 1) / P of the vector out of a host per group, an all-to-all
q (P - q) / P of it with q of the group's ranks on the host). Ranks are numbered host by host, as
torchrun numbers them. Within a host a collective is a ``Fit``'s: its ring terms at the host's alpha and
beta.

``PAPER`` is the DRIFT paper's platform, the one place its numbers are written; ``Machine.default``
gives it for CUDA and a small CPU host otherwise; ``Machine.measure`` takes this machine's kernel rates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from drift.cost.collectives import Fit

_SPECTRAL_KINDS = ("reduce_scatter", "all_gather", "all_to_all")  # what drift's spectral methods issue


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
        """Round figures of effective rates, what drift's plans reach rather than kernel peaks: "cuda",
        ``PAPER``; otherwise a 2-core host with Gloo on loopback (``drift bench comm``'s fit and the block
        timings of docs/BENCHMARKS.md). One host: give ``hosts`` for several."""
        return PAPER if device_type == "cuda" else _LOOPBACK

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

    @property
    def within_host(self) -> Fit:
        """The link between the ranks of one host."""
        return Fit(self.alpha_s, self.beta_s_per_byte)

    def collective_s(self, kind: str, ranks: int, nbytes: float, stride: int = 1) -> float:
        """Seconds of one collective over a group of ``ranks`` ranks ``stride`` apart (a mesh dim's group,
        every group of that dim at once) on an ``nbytes`` buffer (the whole, all ranks' shares). Within a
        host: (P - 1) alpha + (P - 1) / P n beta for a reduce-scatter, all-gather or all-to-all. Across
        hosts: (P - 1) alpha_h + B beta_h, B the bytes out of each host (the module docstring)."""
        if kind not in _SPECTRAL_KINDS:
            raise ValueError(f"no model for collective {kind!r}")
        if ranks == 1:
            return 0.0
        per_host = self.hosts.ranks_per_host if self.hosts is not None else ranks * stride
        on_host = max(1, min(ranks, per_host // stride))  # the group's ranks on each of its hosts
        if on_host == ranks:
            return self.within_host.predict(kind, ranks, nbytes)
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


# The DRIFT paper's platform (section VI-E: 128^3 x 30, width 20, modes (8, 8, 8, 16), slab, 4 GPUs per
# node). Its collectives: DRIFT's all-reduce + all-gather of the 20 x 65,536 complex64 spectrum
# (n = 10.49 MB) take 5.1 ms per block at P = 4 and 20 ms at P = 32. With the ring terms (all-reduce
# 2(P-1) alpha + 2(P-1)/P n beta, all-gather (P-1) alpha + (P-1)/P n beta): 9 alpha + 2.25 n beta = 5.1 ms
# and 93 alpha + 2.906 n beta = 20 ms, so alpha = 165 us and beta = 1.53e-10 s/B (6.5 GB/s). (A log2 P
# latency term admits no non-negative solution of these two.) Its partial DFTs: the forward and inverse
# take 67 ms per block at P = 4 (local 32 x 128 x 128 x 30, 20 channels); the paper's contraction, every
# kept frequency computed (no conjugate fold), does 2 x 20 x 1.305 GFLOP there: 0.78 TFLOP/s, the
# effective rate the paper's GPUs reached on it. Not measured there, so ``Machine.measure`` on the GPU
# where it matters: cuFFT, memory bound, at a quarter of the partial DFTs' rate, and a pass over a buffer
# at 1 TB/s.
PAPER = Machine(
    matmul_flops_per_s=7.8e11,
    fft_flops_per_s=7.8e11 / 4,
    alpha_s=1.65e-4,
    beta_s_per_byte=1.53e-10,
    copy_s_per_byte=1e-12,
)

# A 2-core host with Gloo on loopback; a copy into a fresh buffer at 2.5 GB/s: one of two ranks sharing
# a core.
_LOOPBACK = Machine(5e10, 5e9, 1e-3, 1.5e-9, pairwise_reduce_scatter=True, copy_s_per_byte=4e-10)
