"""The memory a rank may use (``RankBudget``): ``--memory-per-rank``, else what its device or its share of
the machine has.

A GPU rank has its device's memory. CPU ranks share the machine: each has its share of the memory its
control group allows (cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) or, without a limit, of
the memory available when the run starts (``MemAvailable``). ``drift train`` and ``drift predict`` refuse
a pass whose estimate (``drift.cost.fno_memory``) exceeds it, before any rank allocates. On the CPU ranks
are also held to a given ``--memory-per-rank`` while they run: by the launcher that started them
(``drift.jobs.launch``), or under torchrun (also under srun) by themselves (``MemoryWatch``)."""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's control groups, one "id:controllers:path" a line
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as the largest page-aligned 63-bit value


@dataclass(frozen=True)
class RankBudget:
    """``bytes`` a rank may use, and where the figure comes from (``source``, for messages)."""

    bytes: int
    source: str


def rank_budget(device: str, local_ranks: int, per_rank_gib: float | None = None) -> RankBudget:
    """The budget of each of ``local_ranks`` ranks on this machine on ``device`` ("cpu" or "cuda"):
    ``per_rank_gib`` GiB when given (``--memory-per-rank``), else the GPU's memory, else an equal share of
    the control group's limit or of the available memory."""
    if per_rank_gib is not None:
        return RankBudget(round(per_rank_gib * 2**30), "--memory-per-rank")
    if device == "cuda":
        index = torch.cuda.current_device()
        return RankBudget(torch.cuda.get_device_properties(index).total_memory, f"the memory of GPU {index}")
    available, what = available_bytes(), "the memory available"
    limit = cgroup_limit()
    if limit is not None and limit < available:
        available, what = limit, "the control group's limit"
    shared = f" shared by {local_ranks} ranks" if local_ranks > 1 else ""
    return RankBudget(available // local_ranks, f"{what}{shared}")


def cgroup_limit() -> int | None:
    """This process's memory limit from its control group (v2, else v1), None where there is none."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:  # not Linux
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            file = CGROUP_ROOT / path.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            file = CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < _NO_LIMIT:
            return int(text)
    return None


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo, or the physical memory where there is none (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def peak_bytes(device: torch.device | str) -> int:
    """This rank's peak memory so far: on a GPU the caching allocator's peak; on the CPU its address space's
    peak resident set (``VmHWM``) less its file-backed and shared pages now (the data it held, without the
    library code every rank maps): the private memory ``--memory-per-rank`` holds a rank to. ``VmHWM``, not
    ``getrusage``'s maximum, which a process started by another inherits from it."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:  # not Linux (macOS: getrusage's maximum is in bytes)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    kib = lambda key: int(status[key].split()[0]) * 1024  # noqa: E731
    return kib("VmHWM") - kib("RssFile") - kib("RssShmem")


def private_bytes(pid: int | str = "self") -> int:
    """A process's resident memory that is not file-backed or shared (``statm`` resident less shared): its
    data, without the library code every rank maps (which summing resident sets would count once per rank).
    0 once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class MemoryWatch:
    """Holds this process to ``limit_bytes`` of private memory (``private_bytes``) where no launcher watches
    it (ranks under torchrun, also under srun; drift's own launcher watches the ranks it starts): a daemon
    thread reads it every ``interval_s`` seconds and, once past the limit, writes one line naming ``what`` to
    stderr and ends the process with exit code 1, which ends its peers as any failed rank does. Needs Linux's
    ``/proc`` (``OSError`` at ``start`` elsewhere); a context manager, or ``start``/``stop``."""

    def __init__(self, limit_bytes: int, what: str = "--memory-per-rank", interval_s: float = 0.05) -> None:
        self.limit_bytes, self.what, self.interval_s = limit_bytes, what, interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="drift-memory-watch", daemon=True)

    def start(self) -> MemoryWatch:
        if not Path("/proc/self/statm").exists():
            raise OSError(f"{self.what}: a process's private memory is read from Linux's /proc, absent here")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def __enter__(self) -> MemoryWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _watch(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                used = private_bytes()
            except (OSError, ValueError):  # a read cut short: the next one decides
                continue
            if used > self.limit_bytes:
                line = (
                    f"drift: this rank's private memory reached {used / 2**30:.2f} GiB, past the "
                    f"{self.limit_bytes / 2**30:.2f} GiB it may use ({self.what})\n"
                )
                try:  # one write of the whole line, not interleaved with the main thread's output
                    os.write(2, line.encode())
                finally:  # at once: the main thread may be inside a collective or an allocation
                    os._exit(1)
