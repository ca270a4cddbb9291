"""What the benchmarks need besides ``drift.jobs.launch``: their device, the machine, memory and timings.

The benchmarks start their ranks with ``drift.jobs.launch.run_ranks``, on ``bench_device()`` (``drift bench
--device`` sets ``DRIFT_BENCH_DEVICE``). Helpers for the rank side: ``timed`` (the wall time of a call
between barriers, so every rank sees the slowest rank's time), ``peak_rss_gb``, ``peak_private_gb`` and
``spread`` (median and quartiles of samples).
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from drift import comm
from drift.budget import available_bytes, peak_bytes
from drift.jobs import launch
from drift.profiling import synchronize_device

DEVICE_ENV = "DRIFT_BENCH_DEVICE"


def bench_device() -> str:
    """The device the benchmarks' ranks run on: ``DRIFT_BENCH_DEVICE`` (cpu, the default, or cuda)."""
    return os.environ.get(DEVICE_ENV, "cpu")


def machine() -> dict[str, Any]:
    """What the JSON files record about the machine: cores, memory (GB), torch version, host."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return {"cores": launch.cores(), "memory_gb": round(memory, 2), "torch": torch.__version__, "host": platform.node()}


def available_gb() -> float:
    """What a new process can use without swapping, in GB (``drift.budget.available_bytes``)."""
    return available_bytes() / 1e9


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (ru_maxrss), in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def peak_private_gb() -> float:
    """This process's peak private memory so far (``drift.budget.peak_bytes``), in GB."""
    return peak_bytes("cpu") / 1e9


def rank_zero() -> bool:
    """Whether this process is rank 0 of the default group (it shows the progress bars)."""
    return comm.rank() == 0


def barrier() -> None:
    """Wait for every rank of the default group (and, on a GPU, for this rank's kernels first)."""
    synchronize_device()
    comm.barrier()
    synchronize_device()


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` takes between two barriers: every rank measures the slowest rank's time."""
    barrier()
    start = time.perf_counter()
    fn()
    barrier()
    return time.perf_counter() - start


def spread(samples: list[float]) -> dict[str, float]:
    """Median, quartiles, min, max and mean of ``samples`` (seconds)."""
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
    return {
        "median": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "q1": q[0],
        "q3": q[2],
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }
