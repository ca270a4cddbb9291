"""Spawn P ranks on 127.0.0.1, run one function on each, collect what every rank returns.

``run_ranks(P, fn, *args)`` starts P fresh processes (spawn), joins them into a Gloo process group (NCCL
with one GPU per rank when ``DRIFT_BENCH_DEVICE=cuda``; ``device()`` is the rank's device) on a
free port whose collectives time out after ``group_timeout_s``, gives each ``OMP_NUM_THREADS`` or
``max(1, cores // P)`` threads (``set_rank_threads`` sets the former), calls ``fn(*args)`` on every rank and returns the
per-rank results in rank order. Any failure is a ``RankError`` and never a hang: an exception or a death
on one rank ends the others (torch's process context terminates them), a run longer than ``timeout_s``
is killed, and with ``memory_cap_gb`` the summed resident memory of the ranks is polled and the ranks
are killed when it exceeds the cap (``MemoryCapExceeded``; memory here is private: resident and not
file-backed).

Helpers for the rank side: ``timed`` (the wall time of a call between barriers, so every rank sees the
slowest rank's time), ``peak_rss_gb`` and ``spread`` (median and quartiles of samples).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import platform
import resource
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from drift import comm, launch
from drift.profiling import synchronize_device


class RankError(RuntimeError):
    """A rank raised, died or ran past the timeout."""


class MemoryCapExceeded(RankError):
    """The ranks together used more resident memory than the cap."""


def machine() -> dict[str, Any]:
    """What the JSON files record about the machine: cores, memory (GB), torch version, host."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return {"cores": launch.cores(), "memory_gb": round(memory, 2), "torch": torch.__version__, "host": platform.node()}


def available_gb() -> float:
    """MemAvailable from /proc/meminfo, in GB (what a new process can use without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _private_gb(pid: int | str) -> float:
    """Resident memory of a process that is not file-backed (statm resident - shared), in GB: its
    data, without the library code every rank maps (which summing RSS would count once per rank)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE") / 1e9


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (ru_maxrss), in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def peak_private_gb() -> float:
    """This process's peak resident memory less its file-backed pages now (GB): the peak of its data,
    assuming the mapped code stays resident after start-up."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return peak_rss_gb() - int(fields[2]) * os.sysconf("SC_PAGE_SIZE") / 1e9


DEVICE_ENV = "DRIFT_BENCH_DEVICE"


def _on_cuda() -> bool:
    return os.environ.get(DEVICE_ENV, "cpu") == "cuda"


def device() -> torch.device:
    """This rank's device: the CPU, or with ``DRIFT_BENCH_DEVICE=cuda`` GPU ``rank`` (``run_ranks`` checks
    that there is one per rank)."""
    if not _on_cuda():
        return torch.device("cpu")
    return torch.device("cuda", dist.get_rank() if dist.is_initialized() else 0)


def _entry(rank: int, size: int, port: int, threads: int, group_timeout_s: float, out: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    cuda = _on_cuda()
    if cuda:
        torch.cuda.set_device(rank)
    # Even one rank joins a group, so that barriers and drift.comm behave the same at every P.
    timeout = datetime.timedelta(seconds=group_timeout_s)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size, timeout=timeout)
    try:
        result = fn(*args)
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(result))
    except BaseException as exc:
        # The parent reports every rank's error: the first rank to die is often only a peer that
        # lost its connection, not the cause.
        Path(out, f"{rank}.err").write_text(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        raise
    finally:
        comm.destroy_process_group()


@contextlib.contextmanager
def set_rank_threads(count: int | None) -> Iterator[None]:
    """Inside the block, ranks started by ``run_ranks`` (and by ``drift.launch``) get ``count`` threads
    each, through ``OMP_NUM_THREADS`` (None: leave it; unset, each rank gets ``max(1, cores // P)``). On
    a loaded machine one thread per rank avoids stalls of multi-threaded gemms whose threads get
    descheduled."""
    if count is None:
        yield
        return
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


def run_ranks(
    size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout_s: float = 900.0,
    group_timeout_s: float = 300.0,
    threads: int | None = None,
    memory_cap_gb: float | None = None,
) -> list[Any]:
    """``fn(*args)`` on ``size`` fresh Gloo ranks; the per-rank return values (picklable) in rank order.

    ``fn`` must be importable (a module-level function). Raises ``RankError`` when a rank fails or the
    run exceeds ``timeout_s`` seconds, ``MemoryCapExceeded`` when the ranks' summed resident memory
    exceeds ``memory_cap_gb`` (polled every 50 ms, private memory: see ``peak_private_gb``).
    """
    gpus = torch.cuda.device_count()
    if _on_cuda() and size > gpus:
        raise RankError(f"{size} ranks on CUDA need {size} GPUs (one each, for NCCL), found {gpus}")
    threads = threads or launch.threads_per_rank(size)
    with tempfile.TemporaryDirectory(prefix="drift-bench-") as tmp:
        entry_args = (size, free_port(), threads, group_timeout_s, tmp, fn, args)
        ctx = mp.start_processes(_entry, args=entry_args, nprocs=size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.05):
                if memory_cap_gb is not None:
                    used = sum(_private_gb(pid) for pid in ctx.pids())
                    if used > memory_cap_gb:
                        raise MemoryCapExceeded(f"{size} ranks used {used:.2f} GB > cap {memory_cap_gb:.2f} GB")
                if time.monotonic() > deadline:
                    raise RankError(f"{size} ranks did not finish within {timeout_s:.0f} s")
        except ProcessException as exc:
            errors = [f"rank {p.stem}: {p.read_text()}" for p in sorted(Path(tmp).glob("*.err"))]
            detail = "; ".join(errors) or " ".join(str(exc).split())[-400:]
            raise RankError(f"rank {exc.error_index} failed: {detail}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        return [pickle.loads(Path(tmp, f"{r}.pkl").read_bytes()) for r in range(size)]


def rank_zero() -> bool:
    """Whether this process is rank 0 of the default group (it shows the progress bars)."""
    return dist.get_rank() == 0


def barrier() -> None:
    """Wait for every rank of the default group (and, on a GPU, for this rank's kernels first)."""
    synchronize_device()
    dist.barrier()
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
